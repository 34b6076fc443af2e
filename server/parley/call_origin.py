"""Who a call is between and what it was opened with: the parties as the transport names them, and the
variables a call token or the caller set, each kept with its source (agent/variables.py)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from parley import metrics
from parley.agent.agentfile import Agent
from parley.agent.variables import CALLER, SERVICE_NAMES, TOKEN, Source, Variables
from parley.log import event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Origin:
    """What a transport knows of a call before it starts: `caller` (a SIP From URI, a phone number) and
    `called` (the request-URI, the number dialled) when it knows them, the claims of the token that
    allowed it (the signer's word: any name), and what the caller sent (the offer's context, a carrier's
    parameters, SIP headers: only what the agent file lets a caller set). `outbound`: the agent dialled
    (the callee answered), rather than was called."""

    caller: str = ""
    called: str = ""
    token_context: Mapping[str, str] = field(default_factory=dict)
    caller_context: Mapping[str, str] = field(default_factory=dict)
    outbound: bool = False


class CallContext:
    """A call's parties and variables, as its agent's templates and tools see them."""

    def __init__(self, call_id: str, transport: str, agent: Agent, origin: Origin) -> None:
        self.call_id = call_id
        self.transport = transport
        self.caller = origin.caller
        self.called = origin.called
        self.outbound = origin.outbound
        self.values: dict[str, str] = {}
        self._sources: dict[str, Source] = {}
        self._take(origin.token_context, TOKEN, agent)
        self._take(origin.caller_context, CALLER, agent)

    def _take(self, values: Mapping[str, str], source: Source, agent: Agent) -> None:
        """A caller sets only what the agent file declares, and never what a token set; nobody sets the
        service's own names."""
        dropped = []
        for name, value in values.items():
            if name in SERVICE_NAMES:
                continue  # a carrier's parameters name the parties too: the call has them already
            bound = self._sources.get(name) == TOKEN
            if source == CALLER and (bound or not agent.caller_may_set(name)):
                dropped.append(name)
                continue
            self.values[name] = value
            self._sources[name] = source
        if dropped:
            metrics.VARIABLES_DROPPED_TOTAL.labels(transport=self.transport).inc(len(dropped))
            event(
                log, "variables_dropped", logging.DEBUG, call_id=self.call_id, names=",".join(dropped)[:200]
            )

    def variables(self) -> Variables:
        """The values, and what the service knows itself (the parties as the peer named them are the
        caller's word)."""
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        values = {
            **self.values,
            "call_id": self.call_id,
            "transport": self.transport,
            "caller": self.caller,
            "called": self.called,
            "now": now,
        }
        sources: dict[str, Source] = {**self._sources, "caller": CALLER, "called": CALLER}
        return Variables(values, sources)
