"""The hold: a write that reaches a front not open waits there for it (seed 002 "Fronts").

:class:`Hold` is the holding half of :class:`berth.front.path.RequestPath`: a held write waits
for ``open`` (then it is forwarded), a failure, a lasting wait, the client's deadline
(``X-Berth-Deadline``) or the wait limit, in arrival order for the engine's slots (issue 34);
a streaming one gets keep-alive bytes meanwhile (:mod:`.held`). Its body comes in before the
wake is asked (a malformed one is a 400 and wakes nothing). The attributes it reads are the
front's (set by :class:`berth.front.Front`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from . import held
from .rules import DEADLINE_MARGIN_S, RETRY_AFTER_S, RETRY_LASTING_S, FrontState, client_deadline_s

if TYPE_CHECKING:
    from .server import ClientConnection, Request

log = logging.getLogger("berth.front")
F = FrontState

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Hold:
    """Holding a write until its front can forward it, or answering why it cannot."""

    async def _hold(self, req: "Request", client: "ClientConnection") -> bool:
        """Wait for ``open`` (then forward), a failure, the client's deadline or the wait limit.
        A streaming request held long gets keep-alive bytes meanwhile (:mod:`.held`). A
        malformed ``X-Berth-Deadline`` was answered 400 by :meth:`_handle`."""
        stream = None
        if held.wants_stream(req):
            stream = held.HeldStream(req, client, self.name, self._held_for)
            stream.start()
        try:
            answer = await self._held(req, client)
        finally:
            if stream is not None:
                stream.stop()
        if answer is not None:
            reason, message = answer
            if stream is not None and stream.started:
                client.write(held.error_event(message, reason))
                return True
            # a lasting no_room is answered at once: a 1 s Retry-After would make it a loop
            lasting = reason == "no_room" and self.lasting
            return self._unavailable(req, reason, message,
                                     RETRY_LASTING_S if lasting else RETRY_AFTER_S)
        if stream is not None and stream.started:
            client.write(stream.ready())
            return await self._forward(req, client, headless=True)
        return await self._forward(req, client)

    def _held_for(self) -> str:
        """What a held request waits for, in words (a loading state's text)."""
        if self._state is F.OPEN:
            return (f"runs {self.in_flight} request{'' if self.in_flight == 1 else 's'} at once "
                    "(its slots); this one waits for a slot")
        why = f": {self.cause}" if self.cause else ""
        return f"is {self._state}{why}"

    async def _held(self, req: "Request", client: "ClientConnection") -> tuple[str, str] | None:
        """The hold itself: None when the request may go to the engine, else the reason and
        message of the 503 that answers it."""
        loop = asyncio.get_running_loop()
        limit_s, reason = self.wait_limit_s, "wait_limit"
        client_s = client_deadline_s(req.headers)
        if client_s is not None and client_s - DEADLINE_MARGIN_S < limit_s:
            limit_s, reason = max(0.0, client_s - DEADLINE_MARGIN_S), "client_deadline"
        # A client that names its own deadline in X-Berth-Deadline asked to wait even when
        # nothing under way can end the wait (issue 12 case 6).
        patient = any(k.lower() == b"x-berth-deadline" for k, _ in req.headers)
        epoch = self._fail_epoch
        self.held += 1
        self._holding += 1
        self._arrive(req)
        self._line.append(req)
        if not req.body_in:
            req.watcher = self._notify   # the wake waits for the body: look again as it comes
        forward = False
        try:
            async with asyncio.timeout_at(loop.time() + limit_s):
                while True:
                    if req.bad is not None:
                        raise req.bad    # a 400 (ClientConnection._serve), before any wake
                    if self._fail_epoch != epoch:
                        return self._fail_reason, (f"engine {self.name!r} is unavailable: "
                                                   f"{self._fail_reason}")
                    st = self._state
                    if st is F.OPEN and (self.max_in_flight is None or (
                            self._line[0] is req and self.in_flight < self.max_in_flight)):
                        forward = True
                        return None
                    if st is not F.OPEN and self.lasting and not patient:
                        return "no_room", (f"engine {self.name!r} cannot have its card now: "
                                           f"{self.cause}; nothing under way can change that "
                                           "(send X-Berth-Deadline: SECONDS to wait anyway)")
                    if st is F.STOPPED:
                        return self._stop_reason, (f"engine {self.name!r} is not running: "
                                                   f"{self._stop_reason}")
                    if st is F.ASLEEP and _body_in(req, client):
                        self._ask_wake()
                    await self._changed.wait()
        except TimeoutError:
            self.held_timeouts += 1
            who = "the client's deadline" if reason == "client_deadline" else "the wait limit"
            why = f"; it waits for: {self.cause}" if self.cause else ""
            return reason, (f"engine {self.name!r} was not ready within {who} ({limit_s:g} s, "
                            f"state {self._state}){why}; the request was held and not sent")
        except asyncio.CancelledError:
            self.client_gone += 1
            raise
        finally:
            self._leave_line(req, forward)

    def _leave_line(self, req: "Request", forward: bool) -> None:
        """``req`` is held no more (forwarded when ``forward``): the next in line may take a
        slot; the last hold gone while waking tells the run the wake is no longer wanted."""
        req.watcher = None
        self._holding -= 1
        first = self._line[0] is req
        self._line.remove(req)
        if first and self._line:
            self._notify()   # the next held write may take a slot left free
        if not forward:
            self._unheld(req)
        if self._holding == 0 and self._state is F.WAKING and self._on_unwanted is not None:
            try:
                self._on_unwanted()
            except Exception:
                log.exception("front %s: on_unwanted callback failed", self.name)


def _body_in(req: "Request", client: "ClientConnection") -> bool:
    """Whether a held write's body is in far enough to ask for a wake: all of it, or the
    first MiB (what the front buffers) of a large or chunked one. A body found malformed
    before that is a 400 and wakes nothing. A client that expects ``100 Continue`` gets it
    now: it sends its body only then."""
    if req.body_in:
        return True
    if req.expect and not req.size:
        client.interim(_CONTINUE)
        req.expect = False       # said once: the forward does not say it again
    return False
