"""What every call of an agent begins with, as the LLM reads it: the phone manners and worked examples
(when on), the agent's prompt, its greeting, and the tools it offers (its own and its built-ins, in the
order the LLM stage offers them). The in-process model reads this when it loads, so that no call reads
it again: each new conversation copies those cells (engines/llm_llamacpp.py). An agent file's prompt with
a call's variables in it differs from call to call after the first of them; the start before it is
still shared."""

from __future__ import annotations

from parley.agent.agentfile import Agent, default_agent
from parley.agent.builtins import offered_tools
from parley.agent.manners import prompt_start
from parley.agent.templates import placeholders
from parley.agent.variables import Variables, system_prompt
from parley.agent_settings import AgentSettings
from parley.engines.llm import Opening


def opening_of(agent: Agent, *, manners: bool) -> Opening:
    """`agent`'s calls' common start, with `manners` as the service's phone manners setting."""
    messages = prompt_start(system_prompt(agent.system_prompt, Variables({})), manners=manners)
    if agent.greeting and not placeholders(agent.greeting):
        messages.append({"role": "assistant", "content": agent.greeting})
    return Opening(messages, offered_tools(agent) or None)


def default_opening(settings: AgentSettings) -> Opening:
    """The start of a call of the default agent of a service run without agent files."""
    return opening_of(
        default_agent(settings.system_prompt, settings.greeting), manners=settings.phone_manners
    )
