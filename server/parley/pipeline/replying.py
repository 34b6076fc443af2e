"""The LLM stage: a reply, streamed to TTS piece by piece, and the tools the model asks for on the way.

The loop (the README's "Make it act"): stream the reply; when the model asks for tools, run each on the
tool workers (never on this thread), keep each call and its result in the turn's history, and stream
again with the results. What a tool may do depends on whether the turn can still change:

- A tool with side effects runs only for the newest revision of a turn that has ended: this thread
  waits out the turn's reopen grace (and any pending reopen candidate) first, and a revision that was
  superseded meanwhile never runs it. Starting it settles the turn: it can no longer be reopened
  (pipeline/reopening.py), so a tool never runs for a turn the caller then goes on changing. Once
  started, a tool call runs to its end exactly once, even when the caller interrupts; its result stays
  in the history when the spoken reply after it is cut.
- A tool without side effects runs at once, even for a turn still being spoken (speculatively).

A tool that takes longer than the agent's `hold_after_ms` makes the agent say its `hold_phrase`, once,
and play its `hold_sound` (looped, once what was said before it is synthesised) until the result or the
caller's speech arrives.
A turn that only asks the agent to wait ("Wait.", "Hold on.", or a "stop" Whisper wrote as "Uh..."; see
pipeline/backchannels.py) gets the agent's `yield_phrase`, not the model's reply: there is nothing to
answer, and a small model answered it with a refusal.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parley import metrics
from parley.agent.agentfile import Agent, ToolSpec
from parley.agent.builtins import LineActions, builtin_tools
from parley.agent.tools import ToolResult, ToolRunner, error_result
from parley.agent.variables import Variables, spoken
from parley.engines.llm import LlmEngine
from parley.engines.toolcalls import ToolCall
from parley.log import event
from parley.pipeline.backchannels import BackchannelJudge
from parley.pipeline.messages import ReplyText, Response, Tag, Transcript
from parley.pipeline.queues import StageQueue
from parley.pipeline.reply_guard import guarded_stream
from parley.pipeline.segmenter import ReplySegmenter, ends_sentence
from parley.pipeline.stages import Stage, StageContext

log = logging.getLogger(__name__)

MAX_TOOL_ROUNDS = 3  # model -> tools -> model ... : a model that keeps asking is stopped here
WAIT_SLICE_S = 0.05
# A piece is cut early when the reply's audio would otherwise play out within this: about what Piper
# takes for a few words on this CPU (0.15-0.3 s), so the next piece is ready as the last one ends.
HURRY_S = 0.4


@dataclass(frozen=True)
class AgentContext:
    """What the LLM stage needs of its call beyond what every stage does: the agent and what it may do."""

    agent: Agent
    actions: LineActions
    variables: Callable[[], Variables]
    tool_runner: ToolRunner | None = None
    publish: Callable[[str, dict[str, Any]], None] = lambda kind, data: None


class LlmStage(Stage[Transcript]):
    stage_name = "llm"
    engine_name = "llm"

    def __init__(
        self,
        ctx: StageContext,
        agent: AgentContext,
        inbox: StageQueue[Transcript],
        llm: LlmEngine,
        outbox: StageQueue[ReplyText],
    ):
        super().__init__(ctx, inbox)
        self.reply_ctx = agent
        self.llm = llm
        self.outbox = outbox
        self.judge = BackchannelJudge.for_settings(ctx.settings)
        self._tools: dict[str, ToolSpec] | None = None

    def tools(self) -> dict[str, ToolSpec]:
        """The agent's tools and the built-ins it enables (made once, on first use)."""
        if self._tools is None:
            specs = [
                *self.reply_ctx.agent.tools,
                *builtin_tools(self.reply_ctx.agent, self.reply_ctx.actions),
            ]
            self._tools = {spec.name: spec for spec in specs}
        return self._tools

    def due(self, item: Transcript) -> Callable[[], float]:
        return item.response.text_due_at  # the words are due before their audio (pipeline/messages.py)

    def held(self, item: Transcript) -> Callable[[], bool]:
        # While the reply's first piece is voiced, the engine starts no step for it: the stage's own pause
        # (`_Reply.should_stop`, between tokens) comes a step late when the cores are busy.
        limit_s = self.ctx.settings.yield_to_tts_ms / 1000
        return lambda: item.response.first_audio_wait_s(limit_s) > 0

    def handle(self, item: Transcript) -> None:
        response = item.response
        tag = response.tag
        if self.ctx.replies.is_stale(tag):
            return
        assert tag.turn_id is not None
        reply = _Reply(self, response)
        offered = [spec.as_openai() for spec in self.tools().values()] or None
        lookups = tuple(
            spec.name
            for spec in self.tools().values()
            if not spec.side_effects and spec.parameters.get("properties")
        )
        stable = getattr(self.llm, "reuses_prefixes", False)
        yielding = self.reply_ctx.agent.yield_phrase
        try:
            if yielding and self.judge.asks_to_wait(item.text, item.command_odds):
                # "Wait." / "Hold on.": nothing to answer; the floor is the caller's (agent/agentfile.py).
                event(log, "floor_yielded", call_id=self.ctx.call_id, turn_id=tag.turn_id)
                reply.put(spoken(yielding, self.reply_ctx.variables()))
                return
            for round_number in range(MAX_TOOL_ROUNDS + 1):
                messages = self.ctx.conversation.messages_for(tag.turn_id, stable_prefix=stable)
                last_round = round_number == MAX_TOOL_ROUNDS
                calls = reply.stream(messages, None if last_round else offered, lookups)
                if not calls or self.ctx.replies.is_stale(tag):
                    break
                reply.flush()  # what the model said before asking ("let me check") is heard first
                if not self.run_tools(response, calls):
                    break
            reply.finish()
        finally:
            self.outbox.put(ReplyText(response, "", final=True))

    def recover(self, item: Transcript) -> None:
        if not self.ctx.replies.is_stale(item.response.tag):
            self.ctx.replies.apologise()  # the model failed on a turn the caller still waits on

    # tools

    def run_tools(self, response: Response, calls: list[ToolCall]) -> bool:
        """Run the calls one after another; False when the reply should stop (stale, or superseded)."""
        held = False
        for call in calls:
            spec = self.tools().get(call.name)
            if spec is None:
                self._record(
                    response, error_result(call, f"there is no tool named {call.name!r}", time.monotonic())
                )
                continue
            if spec.side_effects and not self._turn_final(response.tag):
                metrics.TOOL_CALLS_TOTAL.labels(outcome="skipped").inc()
                event(
                    log,
                    "tool_skipped",
                    call_id=self.ctx.call_id,
                    tool=spec.name,
                    turn_id=response.tag.turn_id,
                )
                return False
            future = self._submit(spec, call, response)
            held = self._wait(future, response, held)
            if future is None or not future.done() or self.ctx.replies.is_stale(response.tag):
                return False
        return True

    def _turn_final(self, tag: Tag) -> bool:
        """Waits until the turn's revision can no longer be reopened; True if it is still the newest.

        A speculative reply first waits for its turn to end at all: until then the caller may go on.
        """
        assert tag.turn_id is not None and tag.revision is not None
        if not self.ctx.replies.wait_turn_ended(tag):
            return False
        return self.ctx.replies.settle(tag)

    def _submit(
        self, spec: ToolSpec, call: ToolCall, response: Response
    ) -> concurrent.futures.Future[ToolResult] | None:
        runner = self.reply_ctx.tool_runner
        if runner is None:
            return None
        self.ctx.emit(
            {
                "type": "tool_call",
                "turn_id": response.tag.turn_id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        return runner.submit(
            spec,
            call,
            call_id=self.ctx.call_id,
            variables=self.reply_ctx.variables(),
            on_result=lambda result: self._record(response, result),
        )

    def _wait(
        self, future: concurrent.futures.Future[ToolResult] | None, response: Response, held: bool
    ) -> bool:
        """Wait for a tool (the hold phrase, then the hold sound, once it runs long); stops waiting when
        the reply goes stale, leaving the tool to finish on its worker. Returns whether the hold phrase
        was said."""
        if future is None:
            return held
        agent = self.reply_ctx.agent
        hold_at = time.monotonic() + agent.hold_after_ms / 1000
        looping = False
        try:
            while not future.done():
                if self.ctx.replies.is_stale(response.tag):
                    return held
                if time.monotonic() >= hold_at:
                    if not held and agent.hold_phrase:
                        held = True
                        self.speak(response, spoken(agent.hold_phrase, self.reply_ctx.variables()))
                    # After the words before it are synthesised: the Outbound plays it only once they
                    # have played, and would otherwise start it in the gap before their audio.
                    sound = agent.hold_sound
                    if sound is not None and not looping and response.pieces_spoken >= response.pieces_sent:
                        looping = True
                        self.ctx.replies.loop_sound(response.tag, sound)
                concurrent.futures.wait([future], timeout=WAIT_SLICE_S)
        finally:
            if looping:
                self.ctx.replies.stop_sound()  # the result (or the end of the wait) stops it mid-clip
        return held

    def speak(self, response: Response, text: str) -> None:
        """Hand a piece of `response` to TTS, counted so that the reply knows what is still on its way."""
        if text:
            response.pieces_sent += 1
            response.text_sent += len(text)
            self.outbox.put(ReplyText(response, text))

    def _record(self, response: Response, result: ToolResult) -> None:
        """On the tool's worker, before its future resolves: the next round's prompt sees the result."""
        tag = response.tag
        assert tag.turn_id is not None
        record = result.as_record()
        self.ctx.conversation.add_tool_result(tag.turn_id, tag.revision, record)
        metrics.TOOL_CALLS_TOTAL.labels(outcome="ok" if result.ok else "error").inc()
        self.ctx.emit({"type": "tool_result", "turn_id": tag.turn_id, **record})
        self.reply_ctx.publish("tool.called", {"turn_id": tag.turn_id, **record})


class _Reply:
    """One reply's text on its way to TTS: pieces, the sentence limit, and the LLM's timings."""

    def __init__(self, stage: LlmStage, response: Response) -> None:
        self.stage = stage
        self.ctx = stage.ctx
        self.response = response
        self.segmenter = ReplySegmenter()
        self.sentences_left = self.ctx.settings.max_reply_sentences
        self.started = time.monotonic()
        self.yield_s = self.ctx.settings.yield_to_tts_ms / 1000

    def over(self) -> bool:
        return self.ctx.replies.is_stale(self.response.tag) or self.sentences_left <= 0

    def should_stop(self) -> bool:
        # Between tokens. Once the first piece is out, the model waits for its audio: on a CPU the two
        # compete for the same cores, and the caller hears nothing until that audio is ready. The engine
        # holds the reply by the same rule before each step (LlmStage.held).
        wait_s = self.response.first_audio_wait_s(self.yield_s)
        if wait_s > 0:
            self.response.audio_ready.wait(wait_s)
        return self.ctx.replies.is_stale(self.response.tag)

    def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        lookups: tuple[str, ...] = (),
    ) -> list[ToolCall]:
        """Stream one model turn into TTS; returns the tool calls it asked for. The sentence limit is per
        model turn: "Let me check." before a tool and the answer after it are two turns."""
        calls: list[ToolCall] = []
        self.sentences_left = self.ctx.settings.max_reply_sentences
        deltas = guarded_stream(
            self.stage.llm, messages, self.should_stop, tools, lookups=lookups, on_regenerate=self.regenerated
        )
        for delta in deltas:
            if self.response.llm_first_token_s is None:
                self.response.mark("first_token")
                self.response.llm_first_token_s = time.monotonic() - self.started
                metrics.STAGE_LATENCY.labels(stage="llm_first_token").observe(self.response.llm_first_token_s)
            if isinstance(delta, ToolCall):
                self.response.mark("tool_call")
                calls.append(delta)
                continue
            hurry = self.response.runs_dry_within(HURRY_S)
            for piece in self.segmenter.push(delta, hurry=hurry):
                self.put(piece)
            if self.over():
                break
        return calls

    def regenerated(self, reason: str) -> None:
        self.response.mark("regenerated")
        event(
            log,
            "reply_regenerated",
            call_id=self.ctx.call_id,
            turn_id=self.response.tag.turn_id,
            reason=reason,
        )

    def put(self, piece: str) -> None:
        if self.sentences_left <= 0:
            return
        self.response.mark("first_piece")
        self.stage.speak(self.response, piece)
        self.sentences_left -= ends_sentence(piece)

    def flush(self) -> None:
        if not self.ctx.replies.is_stale(self.response.tag):
            for piece in self.segmenter.flush():
                self.put(piece)

    def finish(self) -> None:
        self.flush()
