"""The open state's shortest way: a request forwarded from the parser's callback, with no task.

When a request's body is complete, the front is open with a slot free, nothing else is being
answered on the client's connection, and a kept-alive engine connection is idle, the front writes
the request to the engine at once, in the same turn of the event loop that read it, and finishes
the exchange in the engine connection's ``on_settled`` callback. Everything else (holding, a new
engine connection, a streamed body, a stale connection's retry, pipelined requests behind it, a
malformed ``X-Berth-Deadline`` that is answered 400) takes :meth:`RequestPath._forward` in the
connection's task. Both count the request in flight the moment it is forwarded, so a drain that
starts later waits for it.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from .path import RequestPath, request_bytes, request_head
from .rules import FrontState, bad_berth_deadline, error_answer
from .upstream import Address, EngineConnection, EngineFailed, StaleConnection

if TYPE_CHECKING:
    from .server import ClientConnection, Request

log = logging.getLogger("berth.front")


class FastPath(RequestPath):
    """The task-free forward of :mod:`berth.front.fast`."""

    def _fast(self, req: "Request", client: "ClientConnection") -> bool:
        """Forward ``req`` now if the shortest way applies; False when the task must."""
        if self._state is not FrontState.OPEN or (self.max_in_flight is not None and (
                self.in_flight >= self.max_in_flight or self._line)):
            return False
        addr = self._addr
        if addr is None or bad_berth_deadline(req.headers) is not None:
            return False   # a malformed X-Berth-Deadline: the task's way answers its 400
        engine = self._pool.take(addr)
        if engine is None:
            return False
        body = b"".join(req.parts)   # kept in req.parts: a stale connection's retry sends it
        # The request leaves first and is counted and tied up after: the engine starts on it
        # sooner, and its answer is read on a later turn of the loop, never before.
        engine.write(request_bytes(req, request_head(req, addr), body))
        self._forwarding(req)
        engine.begin(client, req.method == b"HEAD", req.version == "1.0",
                     functools.partial(self._fast_done, req, client, engine, addr))
        client.exchange = engine
        return True

    def _fast_done(self, req: "Request", client: "ClientConnection", engine: EngineConnection,
                   addr: Address, outcome: bool | EngineFailed | None) -> None:
        """The exchange ended: answered (``outcome`` True: the engine connection is reusable),
        failed (an :class:`EngineFailed`), or None: the client went."""
        client.exchange = None
        keep = req.version != "1.0"
        reusable = False
        retry = False
        exc = outcome if isinstance(outcome, EngineFailed) else None
        if outcome is None:   # the client went (ClientConnection.connection_lost)
            self.client_gone += 1
            keep = False
        elif exc is None:
            reusable = bool(outcome)
        elif isinstance(exc, StaleConnection):
            retry = True   # the engine closed it while idle: the task sends the request again
            self.forwarded -= 1     # not served: it only grows (berthd asks whether it moved)
        else:
            self.errors += 1
            if exc.started:
                log.warning("front %s: engine cut the answer mid-stream: %s", self.name, exc)
                keep = False
            else:
                log.warning("front %s: engine failed: %s", self.name, exc)
                client.write(error_answer(502, "engine_failed", f"engine {self.name!r} failed: "
                                          f"{exc}", "upstream_error", head=req.method == b"HEAD"))
        if reusable and addr is self._addr:
            self._pool.release(engine, addr)
        else:
            engine.close()
        arrived = self._arrived.get(req)
        self._forwarded(req)
        if retry:
            if arrived is not None:      # the retry is the same request: it keeps its age
                self._arrived[req] = arrived
            client.run_queue()
        else:
            client.answered(keep)
