"""Who sent a request, as a key: what berthd's forecast of an idle holder's demand compares
(issue 34: the waiter's request came from the client that just got the holder's answer).

A key is a hash of the client's address, never the address itself: berthd only ever compares
two keys, and a hash is all that needs. It is the same in every front on the machine (an
unsalted hash, keyed by a constant), so the fronts of two engines make the same key for one
client.

Which address: the peer of the client's connection; behind a manager on this machine (a peer
on loopback), the last entry of ``X-Forwarded-For``. llama-swap proxies each request with Go's
``httputil.ReverseProxy`` (``NewSingleHostReverseProxy`` in its ``proxy/process.go``), whose
``Director`` branch appends the address of the connection it accepted (``req.RemoteAddr``) to
``X-Forwarded-For`` on every request it forwards. Its own connection to the front says nothing
of its client (it is llama-swap's, from a pool it reuses across clients), so the header's last
entry, the one llama-swap wrote itself, is the client; earlier entries are whatever the client
claimed, and are not read. A header from a peer elsewhere on the network is not trusted either.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .server import Request

__all__ = ["client_key", "peer_key", "address_key", "ClientLog"]

_PERSON = b"berth-client"


def address_key(address: str) -> str:
    """The key of a client address (``"127.0.0.1"``, ``"::1"``): 16 hex digits."""
    return hashlib.blake2b(address.encode("utf-8", "replace"), digest_size=8,
                           key=_PERSON).hexdigest()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_key(req: "Request") -> str | None:
    """The key of the client of ``req`` (see the module docstring); ``None`` when its
    connection has no address (a Unix socket)."""
    transport = req.conn.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    forwarded = [v.decode("latin-1") for k, v in req.headers if k.lower() == b"x-forwarded-for"]
    return peer_key(peer, forwarded)


def peer_key(peer: object, forwarded: list[str]) -> str | None:
    """The key of a client whose connection's peer is ``peer`` (a socket's ``peername``) and
    whose request carries the ``X-Forwarded-For`` values ``forwarded`` (in order), as the
    module docstring says; ``None`` for a peer with no address. For fronts that are not
    Berth's own (the ComfyUI node's gate), so every front makes the same key for one client."""
    host = peer[0] if isinstance(peer, tuple) and peer else None
    if not isinstance(host, str):
        return None
    if _loopback(host) and forwarded:
        last = forwarded[-1].rsplit(",", 1)[-1].strip()
        if last:
            return address_key(last)
    return address_key(host)


class ClientLog:
    """A front's record of who its model requests came from (issue 34): the key of each one
    held or forwarded now, and who got its last answer and when (``answered_client``,
    ``answered_at``, ``time.monotonic`` seconds). ``on_quiet()``: called when the front's
    last request in flight ends (the run then reports its jobs at once)."""

    def __init__(self) -> None:
        self.keys: dict = {}
        self.answered_client: str | None = None
        self.answered_at: float | None = None
        self.on_quiet: Callable[[], None] | None = None

    def came(self, req: "Request") -> None:
        """A model request is held or forwarded (once per request)."""
        if req not in self.keys:
            self.keys[req] = client_key(req)

    def left(self, req: "Request", answered: bool, quiet: bool) -> None:
        """``req`` is gone: ``answered`` (its forward ended) makes it the last answer;
        ``quiet``: nothing is in flight any more."""
        key = self.keys.pop(req, _NONE)
        if answered and key is not _NONE:
            self.answered_client, self.answered_at = key, time.monotonic()
        if quiet and self.on_quiet is not None:
            self.on_quiet()

    def oldest(self, arrived: dict) -> str | None:
        """The key of the oldest request in ``arrived`` (request -> time of arrival)."""
        return self.keys.get(min(arrived, key=arrived.__getitem__)) if arrived else None


_NONE = object()
