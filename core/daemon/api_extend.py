"""Requests for room to grow: asked before the growth, withdrawn when nobody wants them.

Source: issue 13 (ComfyUI asks before a prompt whose model files pass its reservation; seed
000's extension event), issue 28 ("withdraw what was asked": a request for room ends when its
prompt ends, fails or is cancelled, and berthd drops one whose asker's process is gone).

=========================================  =================================================
``POST /v1/leases/{id}/extend``            ``{"bytes", "to_bytes"?, "card"?, "client"?,
                                           "client_age_s"?}`` (``to_bytes``: the reservation
                                           needed in all, of which only what the reservation
                                           lacks is asked; whose request, and since when:
                                           issue 34): room to grow, asked before the growth
                                           → 202 ``{"id", "card", "reserved_bytes",
                                           "waiting"}`` (the reservation grows once the
                                           ladder made room: ``GET /v1/leases/{id}``)
``DELETE /v1/leases/{id}/extend``          the request is no longer wanted → ``{"id",
                                           "withdrawn"}`` (``false``: none was waiting); the
                                           lease's owner (or root, or the TCP key) only
=========================================  =================================================

The asker of a waiting request (the caller's PID and start time, from ``SO_PEERCRED`` on the
Unix socket) is watched every ``read_interval``: once that process is gone, the request is
dropped inside the single writer (``Scheduler.unextend``), as if withdrawn. A request asked
over TCP has no known asker and ends only by its grant, a withdraw or its lease's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from aiohttp import web
from berth.daemon.api_bodies import ExtendBody, error, parse_body
from berth.daemon.api_claims import may_act, peer_of
from berth.daemon.broker import Broker
from berth.decide.admission import WaitKind
from berth.decide.model import Lease
from berth.process import ProcessId, alive, identify

__all__ = ["add_routes", "AskerWatch"]

log = logging.getLogger("berth.daemon.api")


class AskerWatch:
    """Drops a waiting request for room once the process that asked for it is gone."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.tasks: set[asyncio.Task] = set()

    def watch(self, lease_id: str, seq: int, asker: ProcessId) -> None:
        """Watch request ``seq`` (the waiter's sequence number) of ``lease_id``."""
        t = asyncio.create_task(self._run(lease_id, seq, asker))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    def _waiting(self, lease_id: str, seq: int) -> bool:
        w = self.broker.sched.queue.get(lease_id)
        return w is not None and w.kind is WaitKind.EXTEND and w.seq == seq

    async def _run(self, lease_id: str, seq: int, asker: ProcessId) -> None:
        every_s = max(0.05, float(self.broker.cfg.policy.read_interval))
        while self._waiting(lease_id, seq):
            if not alive(asker):
                why = f"its asker, pid {asker.pid}, is gone"
                # Decided inside the single writer, on the queue as it is then.
                await self.broker.submit(
                    lambda now, why=why: self.broker.sched.unextend(lease_id, now, why)
                    if self._waiting(lease_id, seq) else [])
                return
            await asyncio.sleep(every_s)

    async def close(self, _app: web.Application | None = None) -> None:
        for t in list(self.tasks):
            t.cancel()
        for t in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t


def add_routes(app: web.Application, broker: Broker,
               lease_of: Callable[[Broker, str], Lease]) -> AskerWatch:
    """Register ``POST`` and ``DELETE /v1/leases/{id}/extend`` on ``app``; ``lease_of(broker,
    id)`` finds a lease or raises (``KeyError``: 404, ``LeaseGone``: 410). Returns the watch,
    closed with the app."""
    askers = AskerWatch(broker)
    app.on_cleanup.append(askers.close)

    async def extend(request: web.Request) -> web.Response:
        """Room to grow, asked for before the growth (issue 13, seed 000's extension event)."""
        lid = request.match_info["id"]
        body: ExtendBody = await parse_body(request, ExtendBody)
        lease = lease_of(broker, lid)
        ok, why = may_act(broker.cfg, lease, peer_of(request))
        if not ok:
            log.warning("extend lease %s refused: %s", lid, why)
            return error(403, f"extend lease refused: {why}", "forbidden")
        try:
            pci = broker.sched.ledger.card(body.card).pci if body.card else next(iter(lease.shares))
        except (KeyError, StopIteration) as e:
            raise web.HTTPBadRequest(reason=f"card: {e.args[0] if e.args else body.card!r}") from None
        queued: list = []

        def ask(now: float):
            age = body.client_age_s
            fx = broker.sched.extend(lid, pci, body.bytes, now, body.client,
                                     None if age is None else now - age, body.to_bytes)
            w = broker.sched.queue.get(lid)
            if w is not None and w.kind is WaitKind.EXTEND:
                queued.append(w.seq)
            return fx
        await broker.submit(ask)
        peer = peer_of(request)
        asker = identify(peer[0]) if peer is not None else None
        if queued and asker is not None:
            askers.watch(lid, queued[0], asker)
        sh = lease.shares[pci]
        return web.json_response({"id": lid, "card": pci, "reserved_bytes": sh.reserved_bytes,
                                  "waiting": bool(queued)}, status=202)

    async def withdraw(request: web.Request) -> web.Response:
        """The request for room is no longer wanted (issue 28)."""
        lid = request.match_info["id"]
        lease = lease_of(broker, lid)
        ok, why = may_act(broker.cfg, lease, peer_of(request))
        if not ok:
            log.warning("withdraw of lease %s's request for room refused: %s", lid, why)
            return error(403, f"withdraw the request for room of lease refused: {why}",
                         "forbidden")
        fx = await broker.submit(
            lambda now: broker.sched.unextend(lid, now, "withdrawn by its asker"))
        return web.json_response({"id": lid, "withdrawn": bool(fx)})

    app.router.add_post("/v1/leases/{id}/extend", extend)
    app.router.add_delete("/v1/leases/{id}/extend", withdraw)
    return askers
