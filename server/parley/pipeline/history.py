"""The conversation as the caller experienced it: user turns, and agent replies only as far as heard.

The LLM's prompt gives a cut reply in the whole sentences the caller heard of it. A fragment cut mid
sentence reads like the caller's own words said back ("A ship last time to see" of a story asked for as
"Tell me a story about a ship last time to see."), and a few of them in its window taught Qwen2.5-0.5B
to answer every turn with the turn itself: replayed over a carrier-stream call of 63 turns (2026-12-03),
26 replies parroted the caller with the fragments in the prompt, 0 without. The call's record keeps
every word that was heard.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from parley.agent.manners import prompt_start
from parley.engines.llm import Message
from parley.pipeline.segmenter import ends_sentence, split_sentences

# A caller's turn is `<call id>:turn-<n>`; the agent's own lines (the greeting, an idle prompt, a
# voicemail message) have keys of their own and are no turn of the caller's.
CALLER_TURN = ":turn-"


def caller_turn_id(call_id: str, number: int) -> str:
    return f"{call_id}{CALLER_TURN}{number}"


@dataclass
class TurnRecord:
    turn_id: str
    revision: int = 0
    user_text: str = ""
    agent_text: str = ""
    agent_state: str = "pending"  # pending | committed | interrupted | no_reply
    started_at: float = field(default_factory=time.time)
    response_s: float | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # tool calls made for this turn, with results

    def as_json(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "revision": self.revision,
            "user": self.user_text,
            "agent": self.agent_text,
            "agent_state": self.agent_state,
            "interrupted": self.agent_state == "interrupted",
            "started": self.started_at,
            "response_s": self.response_s,
            "tools": list(self.tools),
        }

    def tool_messages(self) -> list[Message]:
        """The turn's tool calls as the model saw them: its request, then each result. Only those made
        for the turn's latest revision: a lookup a speculative reply made from half a sentence ("order
        47", before the caller went on "...12") is not what the whole sentence asked, and a model shown
        its result answered the whole with it."""
        tools = [t for t in self.tools if t.get("revision", self.revision) == self.revision]
        if not tools:
            return []
        calls = [
            {
                "id": t["tool_call_id"],
                "type": "function",
                "function": {"name": t["name"], "arguments": t["arguments"]},
            }
            for t in tools
        ]
        messages: list[Message] = [{"role": "assistant", "content": "", "tool_calls": calls}]
        messages += [
            {"role": "tool", "tool_call_id": t["tool_call_id"], "content": t["result"]} for t in tools
        ]
        return messages


def whole_sentences(text: str) -> str:
    """The sentences of `text` that were said to their end."""
    sentences = split_sentences(text)
    if sentences and not ends_sentence(sentences[-1]):
        sentences.pop()
    return " ".join(sentences)


class Conversation:
    """Thread-safe: stage threads add user text, the sender commits what was played."""

    def __init__(
        self,
        system_prompt: str,
        max_turns_in_prompt: int = 12,
        max_records: int = 500,
        *,
        manners: bool = False,
    ) -> None:
        self.system_prompt = system_prompt
        self.manners = manners  # the phone manners and worked examples before it (agent/manners.py)
        self.max_turns_in_prompt = max_turns_in_prompt
        self.max_records = max_records
        self._lock = threading.Lock()
        self._turns: dict[str, TurnRecord] = {}

    def _record_locked(self, turn_id: str) -> TurnRecord:
        record = self._turns.get(turn_id)
        if record is None:
            record = self._turns[turn_id] = TurnRecord(turn_id=turn_id)
            while len(self._turns) > self.max_records:
                del self._turns[next(iter(self._turns))]
        return record

    def set_user_text(self, turn_id: str, revision: int, text: str) -> None:
        """The transcript of a turn's revision; an older revision never overwrites a newer one."""
        with self._lock:
            record = self._record_locked(turn_id)
            if revision >= record.revision:
                record.revision = revision
                record.user_text = text
                record.agent_text = ""
                record.agent_state = "pending" if text else "no_reply"

    def commit_agent(
        self, turn_id: str, text: str, *, interrupted: bool, response_s: float | None = None
    ) -> None:
        with self._lock:
            record = self._record_locked(turn_id)
            record.agent_text = text
            record.agent_state = "interrupted" if interrupted else "committed"
            if response_s is not None:
                record.response_s = response_s

    def add_tool_result(self, turn_id: str, revision: int | None, record: dict[str, Any]) -> None:
        """A tool call made for a turn's revision, and its result: it stays in the history even when the
        spoken reply after it is cut, so the model knows what was done (the call record keeps the calls
        of every revision; the prompt only the latest's)."""
        with self._lock:
            turn = self._record_locked(turn_id)
            turn.tools.append({**record, "revision": turn.revision if revision is None else revision})

    def tool_calls(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"turn_id": r.turn_id, **t} for r in self._turns.values() for t in r.tools]

    def messages_for(self, turn_id: str, *, stable_prefix: bool = False) -> list[Message]:
        """The LLM prompt for answering `turn_id`: the phone manners and worked examples, the agent's
        instructions, earlier turns as heard, then this turn.

        The last `max_turns_in_prompt` earlier turns, or, with `stable_prefix`, a window whose start
        moves by that many turns at a time (it holds N to 2N-1 turns): each prompt then begins with the
        whole previous one, which a server that caches prompt prefixes (llama.cpp's, vLLM's) does not
        compute again. A window sliding one turn at a time changes the prompt right after the system
        message every turn (llama-server here kept 27-37 % of the previous prompt).
        """
        with self._lock:
            earlier: list[TurnRecord] = []
            current: TurnRecord | None = None
            for record in self._turns.values():
                if record.turn_id == turn_id:
                    current = record
                    break
                earlier.append(record)
            messages: list[Message] = prompt_start(self.system_prompt, manners=self.manners)
            window = self.max_turns_in_prompt
            if stable_prefix and window > 0:
                start = max(0, len(earlier) - window) // window * window
            else:
                start = max(0, len(earlier) - window)
            for record in earlier[start:]:
                if record.user_text:
                    messages.append({"role": "user", "content": record.user_text})
                messages += record.tool_messages()
                # What was heard, as it was heard (whole sentences of a cut reply): a marker for the cut
                # ("…") measurably made SmolLM2 copy cut-off replies into its next answers.
                heard = record.agent_text if record.agent_state == "committed" else ""
                if record.agent_state == "interrupted":
                    heard = whole_sentences(record.agent_text)
                if heard:
                    messages.append({"role": "assistant", "content": heard})
            if current is not None and current.user_text:
                messages.append({"role": "user", "content": current.user_text})
                messages += current.tool_messages()
            return messages

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [record.as_json() for record in self._turns.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._turns)
