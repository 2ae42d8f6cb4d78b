"""Listeners: a warning at start for one other machines can reach (issue 26), and one line for
one that cannot listen.

A loopback listener (``127.0.0.0/8``, ``::1``, ``localhost``) takes connections from this
machine only; any other address, the unspecified ones (``0.0.0.0``, ``::``) included, takes them
from the network. Berth accepts such an address (it may be meant) but says so once, naming the
setting, what becomes reachable and how to keep it local.

A listener that cannot listen (its port taken, say) ends its command with exit 2, as bad input
does, and one line naming the flag or config key and the address (:func:`cannot_listen`):
``berth run --front``, ``berth gateway --listen`` and berthd's ``[api] tcp`` said it three ways,
with exits 2, 1 and 4, and the last two named neither the flag nor the key.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from pathlib import Path

__all__ = ["is_loopback", "warn_if_exposed", "CannotListen", "cannot_listen", "listener_on"]

_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"          # the kernel's TCP_LISTEN, as /proc/net/tcp writes a socket's state


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address or ``localhost``; ``[::1]`` brackets allowed) is loopback."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(log: logging.Logger, setting: str, address: str, what: str) -> bool:
    """Log a warning if ``address`` (``HOST:PORT``; an empty host is loopback, as every Berth
    listener binds 127.0.0.1 then) is not loopback; ``setting`` names where it came from
    (``"[board] listen"``), ``what`` what other machines can then do. Returns whether it warned."""
    host = address.rpartition(":")[0] or "127.0.0.1"
    if is_loopback(host):
        return False
    log.warning("%s %s is not a loopback address: other machines can reach it; %s. Give "
                "127.0.0.1:PORT unless that is what you mean.", setting, address, what)
    return True


class CannotListen(OSError):
    """A listener that cannot listen; ``str()`` is the one line for the user."""


def cannot_listen(named: str, address: str, error: OSError) -> CannotListen:
    """The error for a listener at ``address`` (``HOST:PORT``) that failed with ``error``;
    ``named`` is how the user gave it: ``--listen 127.0.0.1:8080``, ``[api] tcp =
    "127.0.0.1:8080"``."""
    if error.errno != errno.EADDRINUSE:
        return CannotListen(f"{named}: cannot listen: {error.strerror or error}")
    port = address.rpartition(":")[2]
    who = ("another process listens there" if port.isdigit() and listener_on(int(port))
           else "a connection holds it, not a listener; it is free again within a minute")
    return CannotListen(f"{named}: the port is already in use ({who})")


def listener_on(port: int, tables: tuple[Path, ...] = _TCP_TABLES) -> bool:
    """Whether a TCP socket in this network namespace listens on ``port``, on any address,
    read from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (one read of two small files, no
    connection made). True too when no table can be read (then it cannot tell)."""
    read = False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            # "sl local_address rem_address st ...": local "0100007F:1F90", st "0A"
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN and \
                    int(fields[1].rpartition(":")[2], 16) == port:
                return True
    return not read
