"""The LLM-played caller: after a scenario's scripted turns, a chat model answers whatever the agent says,
in character and towards the caller's goal, until it says goodbye or has played its turns.

What the model writes is spoken by a TTS voice over the phone, so it is cleaned to what a caller would
say: no speaker labels, quotes, stage directions or emojis, and never the agent's side of the call.
"""

from __future__ import annotations

import re
import unicodedata

from parley.scenarios.chat import ChatModel
from parley.scenarios.scenario import LlmCaller

CALLER_MAX_TOKENS = 80  # one or two short sentences, with room for a goodbye and the end token
AGENT_SILENT = "(silence: the agent said nothing)"  # the agent's turn, when it said nothing

SYSTEM_PROMPT = """You are a caller on a phone call to a company's voice agent. You phoned them and the \
agent answered: you are the customer, never the agent. Stay in character the whole call, and let your \
first words say why you are calling.

Who you are: {persona}
What you want from this call: {goal}

The agent's words come to you as you heard them over the phone: they may be cut off or misheard. \
{silent} means the agent said nothing. Each time, answer with only what you say next, out loud:
- one or two short sentences, in plain everyday words, as people talk on the phone;
- no stage directions, no descriptions of what you do, no emojis, no lists, no formatting, no name before \
your words;
- numbers, dates and codes the way you would say them aloud (an order number digit by digit: \
"four one seven two");
- only your own side of the call: never write what the agent says.
When you have what you called for, or it is clear you will not get it, say goodbye and end your line \
with [END]."""

END_TOKEN = re.compile(r"[\[<]\s*end\s*[\]>]", re.IGNORECASE)
# A line the model gave to another speaker: the agent's side, which the caller never says.
OTHER_SPEAKER = re.compile(r"^\s*\**(agent|assistant|representative|operator|user|bot)\**\s*:", re.I)
OWN_LABEL = re.compile(r"^\s*\**(caller|customer|client|me|you)\**\s*:\s*", re.IGNORECASE)
STAGE_DIRECTION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")
QUOTES = '"“”„«»'
INVISIBLE = {"\u200d", "\ufe0f", "\ufe0e"}  # the joiner and selectors emoji sequences are built with


def clean_line(written: str) -> tuple[str, bool]:
    """(what the caller says, whether it ended the call) of the model's `written` answer."""
    end = END_TOKEN.search(written)
    ended = end is not None
    if end is not None:
        written = written[: end.start()]  # whatever follows its end is not the caller's
    kept: list[str] = []
    for line in written.splitlines():
        if OTHER_SPEAKER.match(line):
            break
        kept.append(OWN_LABEL.sub("", line))
    text = STAGE_DIRECTION.sub(" ", " ".join(kept))
    text = "".join(
        c
        for c in text
        if c not in INVISIBLE and c != "*" and unicodedata.category(c) not in ("So", "Sk", "Cs")
    )
    text = " ".join(text.split())
    # A label may sit inside the quotes or outside them: "Caller: Hi." and Caller: "Hi."
    text = OWN_LABEL.sub("", text.strip(QUOTES + " ")).strip(QUOTES + " ")
    if len(text) > 1 and text[0] in "'‘" and text[-1] in "'’":
        text = text[1:-1].strip()
    return text, ended


class LlmCallerPlayer:
    """Plays `spec`'s caller with `chat`. The agent's words are the conversation's "user" turns and the
    caller's the "assistant" ones, so the model writes the caller's side."""

    def __init__(self, spec: LlmCaller, chat: ChatModel) -> None:
        self.spec = spec
        self.chat = chat
        self.turns_played = 0
        self.done = False
        system = SYSTEM_PROMPT.format(
            persona=spec.persona.strip(), goal=spec.goal.strip(), silent=AGENT_SILENT
        )
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]

    async def next_line(self, agent_said: str) -> str | None:
        """What the caller says to `agent_said` (what the agent just said, as heard; "" when it said
        nothing), or None when the caller is done: it said goodbye, said nothing, or played its turns.
        Raises ChatError when the model gives no answer."""
        if self.done or self.turns_played >= self.spec.max_turns:
            self.done = True
            return None
        heard = " ".join(agent_said.split()) or AGENT_SILENT
        self.messages.append({"role": "user", "content": heard})
        written = await self.chat.complete(self.messages, max_tokens=CALLER_MAX_TOKENS, temperature=0.0)
        line, ended = clean_line(written)
        if not line:
            self.done = True
            return None
        self.messages.append({"role": "assistant", "content": line})
        self.turns_played += 1
        self.done = ended or self.turns_played >= self.spec.max_turns
        return line
