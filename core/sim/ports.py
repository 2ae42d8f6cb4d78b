"""TCP ports for servers that the simulation kit's users (the bench, the demo) start in other
processes: free now, and below the kernel's ephemeral range.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, which it also hands
to every outgoing connection of every process: closed, then passed to a server started a moment
later (a run's ``--front``, llama-swap's ``--listen``), it could be some connection's local port
by then, or in its ``TIME_WAIT``, and the server's bind failed "address already in use" (seen
on a loaded machine running the suite). A port below that range is given to no connection.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["ephemeral_low", "free_ports"]

#: Where Linux says which ports it gives outgoing connections ("32768\t60999").
PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port handed out. Below it: well-known and commonly configured services, and the
#: fixed ports of Berth's own docs and examples (the host pages' 18431-18452, llama-swap's
#: ``startPort`` 10001 in its examples), which the docs' tests run while other tests pick ports.
LOW = 20000
TRIES = 200
_PICK = random.SystemRandom()       # not the random module's state, which a caller may seed


def ephemeral_low(path: Path = PORT_RANGE) -> int:
    """The low end of the kernel's ephemeral port range; 32768 (Linux's default) when it
    cannot be read."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``n`` consecutive TCP ports on ``host`` that nothing is bound to now, chosen
    at random from :data:`LOW` up to :func:`ephemeral_low` (checked by binding each, without
    ``SO_REUSEADDR``, so a port in ``TIME_WAIT`` is not taken either). Raises ``RuntimeError``
    when :data:`TRIES` picks find none."""
    hi = max(LOW + n + 1, ephemeral_low())
    for _ in range(TRIES):
        base = _PICK.randrange(LOW, hi - n + 1)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports on {host} from {LOW} to {hi}")
