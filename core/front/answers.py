"""The answers a front writes itself, not the engine's: the ready path's 200 while it holds
writes, a 503 while it cannot forward, a 502 when the engine failed (seed 002 "Fronts",
issue 37).

:class:`Answers` is a mixin of :class:`~berth.front.path.RequestPath`: a method lookup as before,
no work added per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import held
from .rules import RETRY_AFTER_S, FrontState, error_answer

if TYPE_CHECKING:
    from .server import ClientConnection, Request

__all__ = ["Answers", "ready_answer"]

F = FrontState

#: The engine's state behind a front that holds writes, as a health read says it (issue 37).
_ENGINE_WORDS = {F.STARTING: "starting", F.CLOSING: "parking", F.ASLEEP: "parked",
                 F.WAKING: "waking"}


class Answers:
    """The front's own answers; each returns ``True``: the client's connection may carry
    another request. Reads ``engine_state`` of the front."""

    engine_state: str | None

    def _accepting(self, req: "Request", st: FrontState) -> bool:
        req.conn.write(ready_answer(st, self.engine_state, req.method == b"HEAD"))
        return True

    def _unavailable(self, req: "Request", reason: str, message: str,
                     retry_after_s: int = RETRY_AFTER_S) -> bool:
        req.conn.write(error_answer(503, reason, message, "unavailable_error",
                                    head=req.method == b"HEAD", retry_after_s=retry_after_s))
        return True

    def _error(self, req: "Request", status: int, reason: str, message: str) -> bool:
        req.conn.write(error_answer(status, reason, message, "upstream_error",
                                    head=req.method == b"HEAD"))
        return True

    def _fail(self, req: "Request", client: "ClientConnection", headless: bool, code: str,
              message: str) -> bool:
        """A 502 for the client: in-band in a held stream whose head it has already
        (:mod:`.held`), else an answer of its own."""
        if headless:
            client.write(held.error_event(message, code, 502))
            return True
        return self._error(req, 502, code, message)


def ready_answer(st: FrontState, engine_state: str | None, head: bool) -> bytes:
    """The ready path's answer while the front holds writes: 200 for llama-swap's readiness
    (it reads only the status), with the engine's true state for a monitor in ``engine`` and
    the ``X-Berth-Engine`` header (a drained engine is ``drained``, not up; issue 37)."""
    engine = (engine_state or _ENGINE_WORDS.get(st, str(st))).encode()
    body = b'{"status": "ok", "src": "berth", "front": "%s", "engine": "%s"}' % (
        str(st).encode(), engine)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-store"
            b"\r\nX-Berth-Engine: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (engine, len(body), b"" if head else body))
