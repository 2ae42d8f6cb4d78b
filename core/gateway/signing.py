"""Signed calls between gateways: HMAC-SHA256 over the method, the path with its query, a digest
of the body, a timestamp and a nonce, with a replay window.

Source: issue 14 "Many machines" (peer calls are signed with the key; anything else is refused).

Headers on a signed call::

    X-Berth-Peer: <sender's machine name>
    X-Berth-Time: <unix seconds, decimal>
    X-Berth-Nonce: <32 hex digits>
    X-Berth-Signature: <hex HMAC-SHA256(key, METHOD \\n PATH?QUERY \\n sha256(body) \\n TIME
                        \\n NONCE \\n PEER)>

A call is refused (:class:`Refused`, ``reason``) when a header is missing (``unsigned``), the
signature does not match (``bad_signature``), its time is further than the window from ours
(``stale``: a replay after the window, or a clock too far off), or its nonce was seen within the
window (``replayed``). Clocks of the machines must agree to within the window.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Callable, Mapping

__all__ = ["sign", "Verifier", "Refused", "HEADERS"]

HEADERS = ("X-Berth-Peer", "X-Berth-Time", "X-Berth-Nonce", "X-Berth-Signature")


class Refused(Exception):
    """A signed call that is not accepted; ``reason`` is one word (see the module docstring)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _mac(key: bytes, method: str, path_qs: str, body: bytes, ts: str, nonce: str,
         peer: str) -> str:
    digest = hashlib.sha256(body).hexdigest()
    msg = "\n".join((method.upper(), path_qs, digest, ts, nonce, peer)).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def sign(key: str, peer: str, method: str, path_qs: str, body: bytes = b"",
         now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that sign one call. ``path_qs``: the path with its query string, as sent.
    ``now`` (unix seconds) and ``nonce`` are for tests."""
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = nonce or secrets.token_hex(16)
    return {"X-Berth-Peer": peer, "X-Berth-Time": ts, "X-Berth-Nonce": nonce,
            "X-Berth-Signature": _mac(key.encode(), method, path_qs, body, ts, nonce, peer)}


class Verifier:
    """Checks signed calls with one key. ``window_s``: the largest distance in seconds between
    the call's time and ours; nonces are remembered that long."""

    def __init__(self, key: str, window_s: float = 30.0,
                 clock: Callable[[], float] = time.time):
        if not key:
            raise ValueError("key: a peer key cannot be empty")
        self._key = key.encode()
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[str, float] = {}

    def verify(self, method: str, path_qs: str, body: bytes, headers: Mapping[str, str]) -> str:
        """Return the sender's machine name, or raise :class:`Refused`."""
        got = [headers.get(h) for h in HEADERS]
        if not all(got):
            raise Refused("unsigned", "a peer call must be signed (X-Berth-Signature and its "
                                      "headers)")
        peer, ts, nonce, sig = got
        want = _mac(self._key, method, path_qs, body, ts, nonce, peer)
        if not hmac.compare_digest(want, sig):
            raise Refused("bad_signature", "the signature does not match: wrong key, or the "
                                           "call was changed on the way")
        now = self._clock()
        try:
            t = float(ts)
        except ValueError:
            raise Refused("bad_signature", f"X-Berth-Time: not a number: {ts!r}") from None
        if not abs(now - t) <= self.window_s:
            raise Refused("stale", f"the call was signed {now - t:.1f} s from now, outside the "
                                   f"replay window of {self.window_s:g} s")
        self._prune(now)
        if nonce in self._seen:
            raise Refused("replayed", "this call was already received (its nonce was seen)")
        self._seen[nonce] = t
        return peer

    def _prune(self, now: float) -> None:
        if len(self._seen) > 4096 or (self._seen and len(self._seen) % 256 == 0):
            cut = now - 2 * self.window_s
            self._seen = {n: t for n, t in self._seen.items() if t >= cut}
