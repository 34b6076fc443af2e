"""Real SIP peers for the tests: a baresip softphone (`baresip.Baresip`) and SIPp (`sipp.run_sipp`).

Both run as child processes on loopback only, on ports picked here so that tests (and other people's
processes on the same machine) do not collide, and both are reaped when the test ends, passing or not.
"""

from __future__ import annotations

import random
import socket
import threading

# Below Linux's ephemeral range (32768-60999), so a port found free here is not handed out a moment
# later to some client socket by the kernel.
_PORT_LOW = 20000
_PORT_HIGH = 32000
_handed_out: set[int] = set()
_lock = threading.Lock()


def is_free(port: int, *, udp: bool = True, tcp: bool = False) -> bool:
    """Whether `port` can be bound on 127.0.0.1 now (UDP and/or TCP)."""
    kinds = ([socket.SOCK_DGRAM] if udp else []) + ([socket.SOCK_STREAM] if tcp else [])
    for kind in kinds:
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_block(count: int = 1, *, udp: bool = True, tcp: bool = False, step: int = 2) -> int:
    """First of `count` consecutive loopback ports, all free now (UDP and/or TCP), starting on an even
    port when `step` is 2 (RTP on the even port, RTCP on the odd one above).

    Ports this process already handed out are never handed out again, so two peers started by one test
    run never share one; a port taken by another process between this check and the peer's bind shows
    up as the peer failing to bind, which the drivers retry with fresh ports.
    """
    with _lock:
        for _ in range(500):
            base = random.randrange(_PORT_LOW, _PORT_HIGH - count, step)
            block = range(base, base + count)
            if any(port in _handed_out for port in block):
                continue
            if all(is_free(port, udp=udp, tcp=tcp) for port in block):
                _handed_out.update(block)
                return base
    raise RuntimeError(f"no block of {count} free loopback ports in {_PORT_LOW}-{_PORT_HIGH}")


def free_port(*, udp: bool = True, tcp: bool = True) -> int:
    """One loopback port free for UDP and/or TCP (SIP listens on both)."""
    return free_port_block(1, udp=udp, tcp=tcp, step=1)
