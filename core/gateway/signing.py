"""Signed calls between gateways: HMAC-SHA256 over the method, the path with its query, a digest
of the body, a timestamp, a nonce, the sender and the destination, with a replay window that
survives a restart.

Source: issue 14 "Many machines" (peer calls are signed with the key; anything else is refused);
issue 26 "Low" (a signed call could be replayed after a restart, or sent to another peer with
the same key).

Headers on a signed call::

    X-Berth-Peer: <sender's machine name>
    X-Berth-To: <the destination's machine name; empty only on the first engines poll>
    X-Berth-Time: <unix seconds, decimal>
    X-Berth-Nonce: <32 hex digits>
    X-Berth-Signature: <hex HMAC-SHA256(key, METHOD \\n PATH?QUERY \\n sha256(body) \\n TIME
                        \\n NONCE \\n PEER \\n TO)>

A call is refused (:class:`Refused`, ``reason``) when a header is missing (``unsigned``), the
signature does not match (``bad_signature``), it names another machine as its destination
(``wrong_peer``; an empty destination is taken only on ``GET`` of the engines list, which a
sender asks before it knows the peer's name, and which changes nothing), its time is further
than the window from ours (``stale``: a replay after the window, or a clock too far off), or its
nonce was seen within the window (``replayed``). Clocks of the machines must agree to within
the window.

The nonces seen are appended to a file (:class:`NonceLog`, in the state directory) and read
back at start, so a call captured before a restart is still refused after it. Without a
writable file, the verifier refuses every call signed before it started instead.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["sign", "Verifier", "Refused", "HEADERS", "NonceLog", "EMPTY_DIGEST"]

log = logging.getLogger("berth.gateway")

HEADERS = ("X-Berth-Peer", "X-Berth-Time", "X-Berth-Nonce", "X-Berth-Signature")
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
#: The only call a sender may sign before it knows the destination's name.
FIRST_CALL = ("GET", "/berth/v1/peer/engines")


class Refused(Exception):
    """A signed call that is not accepted; ``reason`` is one word (see the module docstring)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _mac(key: bytes, method: str, path_qs: str, digest: str, ts: str, nonce: str, peer: str,
         to: str) -> str:
    msg = "\n".join((method.upper(), path_qs, digest, ts, nonce, peer, to)).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def sign(key: str, peer: str, method: str, path_qs: str, body: bytes = b"", *, to: str = "",
         digest: str | None = None, now: float | None = None,
         nonce: str | None = None) -> dict[str, str]:
    """The headers that sign one call from ``peer`` to the machine named ``to``.
    ``path_qs``: the path with its query string, as sent; ``body`` the body, or ``digest`` its
    SHA-256 (hex) when the body is not at hand. ``now`` (unix seconds) and ``nonce`` are for
    tests."""
    if digest is None:
        digest = hashlib.sha256(body).hexdigest()
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = nonce or secrets.token_hex(16)
    return {"X-Berth-Peer": peer, "X-Berth-To": to, "X-Berth-Time": ts, "X-Berth-Nonce": nonce,
            "X-Berth-Signature": _mac(key.encode(), method, path_qs, digest, ts, nonce, peer, to)}


class NonceLog:
    """The nonces a verifier accepted, one ``TIME NONCE`` line each, appended as they come
    (one small write per call, no fsync: a restart of the process loses nothing) and read back
    at start. Rewritten, atomically, with only the lines still inside the window when it
    grows past ``compact_at`` lines. Raises ``OSError`` when the file cannot be opened."""

    def __init__(self, path: Path, window_s: float, now: float, compact_at: int = 20000):
        self.path, self.window_s, self.compact_at = Path(path), window_s, compact_at
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.loaded: dict[str, float] = self._read(now)
        self._write_all(self.loaded)
        self._lines = len(self.loaded)
        self._f = open(self.path, "a", buffering=1, encoding="ascii")

    def _read(self, now: float) -> dict[str, float]:
        seen: dict[str, float] = {}
        try:
            text = self.path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return seen
        for line in text.splitlines():
            t, _, nonce = line.partition(" ")
            try:
                when = float(t)
            except ValueError:
                continue
            if nonce and now - when <= 2 * self.window_s:
                seen[nonce] = when
        return seen

    def _write_all(self, seen: dict[str, float]) -> None:
        from berth.paths import write_atomic
        write_atomic(self.path, "".join(f"{t:.3f} {n}\n" for n, t in seen.items())
                     .encode("ascii"))

    def add(self, nonce: str, t: float, live: dict[str, float]) -> None:
        self._f.write(f"{t:.3f} {nonce}\n")
        self._lines += 1
        if self._lines > self.compact_at:
            self._f.close()
            self._write_all(live)
            self._lines = len(live)
            self._f = open(self.path, "a", buffering=1, encoding="ascii")

    def close(self) -> None:
        self._f.close()


class Verifier:
    """Checks signed calls with one key, for the machine named ``me``. ``window_s``: the largest
    distance in seconds between the call's time and ours; nonces are remembered that long
    (in ``log`` when given, across restarts)."""

    def __init__(self, key: str, window_s: float = 30.0, me: str = "",
                 log_path: Path | None = None, clock: Callable[[], float] = time.time):
        if not key:
            raise ValueError("key: a peer key cannot be empty")
        self._key = key.encode()
        self.window_s, self.me = window_s, me
        self._clock = clock
        self.started = clock()
        self._log: NonceLog | None = None
        self._seen: dict[str, float] = {}
        if log_path is not None:
            try:
                self._log = NonceLog(log_path, window_s, self.started)
                self._seen = dict(self._log.loaded)
            except OSError as e:
                log.warning("gateway: cannot keep peer nonces in %s (%s): calls signed before "
                            "this start are refused", log_path, e)

    def verify(self, method: str, path_qs: str, digest: str, headers: Mapping[str, str]) -> str:
        """Return the sender's machine name, or raise :class:`Refused`. ``digest``: the body's
        SHA-256, hex."""
        got = [headers.get(h) for h in HEADERS]
        if not all(got):
            raise Refused("unsigned", "a peer call must be signed (X-Berth-Signature and its "
                                      "headers)")
        peer, ts, nonce, sig = got
        to = headers.get("X-Berth-To") or ""
        want = _mac(self._key, method, path_qs, digest, ts, nonce, peer, to)
        if not hmac.compare_digest(want, sig):
            raise Refused("bad_signature", "the signature does not match: wrong key, or the "
                                           "call was changed on the way")
        if to != self.me and not (to == "" and (method.upper(), path_qs) == FIRST_CALL):
            raise Refused("wrong_peer", f"the call is signed for {to or 'no machine'!r}, and "
                                        f"this machine is {self.me!r}")
        now = self._clock()
        try:
            t = float(ts)
        except ValueError:
            raise Refused("bad_signature", f"X-Berth-Time: not a number: {ts!r}") from None
        if not abs(now - t) <= self.window_s:
            raise Refused("stale", f"the call was signed {now - t:.1f} s from now, outside the "
                                   f"replay window of {self.window_s:g} s")
        if self._log is None and t < self.started:
            raise Refused("stale", "the call was signed before this gateway started, and it "
                                   "keeps no record of the calls before")
        self._prune(now)
        if nonce in self._seen:
            raise Refused("replayed", "this call was already received (its nonce was seen)")
        self._seen[nonce] = t
        if self._log is not None:
            self._log.add(nonce, t, self._seen)
        return peer

    def _prune(self, now: float) -> None:
        if len(self._seen) > 4096 or (self._seen and len(self._seen) % 256 == 0):
            cut = now - 2 * self.window_s
            self._seen = {n: t for n, t in self._seen.items() if t >= cut}

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
