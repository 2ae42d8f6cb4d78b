"""Listeners that other machines can reach: a warning at start (issue 26).

A loopback listener (``127.0.0.0/8``, ``::1``, ``localhost``) takes connections from this
machine only; any other address, the unspecified ones (``0.0.0.0``, ``::``) included, takes them
from the network. Berth accepts such an address (it may be meant) but says so once, naming the
setting, what becomes reachable and how to keep it local.
"""

from __future__ import annotations

import ipaddress
import logging

__all__ = ["is_loopback", "warn_if_exposed"]


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
