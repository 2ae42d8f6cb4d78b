"""``PUT`` and ``DELETE /v1/drained/{engine}``: a run tells berthd its engine is drained and its
front waits (issue 35; the registry is :mod:`berth.daemon.drained`).

=========================================  =================================================
``PUT /v1/drained/{engine}``               ``{"front"?, "holding", "why"?, "owner_pid"?,
                                           "asking"?, "aliases"?, "since"?}``: the engine is drained and its run
                                           waits → ``{"engine", "since", "wake"}``; sent again when
                                           ``holding`` changes and every few seconds (a
                                           restarted berthd learns it again)
``GET /v1/drained/{engine}/wake``          long-poll ``?timeout=S`` (default 25): ``{"engine",
                                           "wake"}``, answered at once when an operator's
                                           ``berth wake`` asks the run to ask for its card
                                           again (``wake`` true), else after S seconds
``DELETE /v1/drained/{engine}``            the engine serves again, or the run ends →
                                           ``{"engine", "removed"}``
=========================================  =================================================

A malformed call is a 400 naming the field and value; a caller that is neither the entry's run
(or its ancestor) nor an operator gets a 403.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated

from aiohttp import web
from berth.daemon.api_bodies import _Body, error, parse_body, query_number
from berth.daemon.api_claims import (
    caller_of_request,
    is_operator,
    is_self_or_descendant,
    peer_of,
)
from berth.daemon.drained import DrainedRuns
from berth.process import ProcessId, alive, identify
from pydantic import Field

__all__ = ["DrainedBody", "add_routes"]

log = logging.getLogger("berth.daemon.api")

#: Engine names as a lease takes them (api_bodies.LeaseBody.engine).
_ENGINE = r"^[^\s\x00-\x1f\x7f]+$"


class DrainedBody(_Body):
    front: str | None = Field(None, max_length=300)
    holding: int = Field(0, ge=0, le=1_000_000)
    why: str = Field("", max_length=500)
    owner_pid: int | None = Field(None, ge=1)
    # The run asked for a new grant (a write came): its lease waits in the queue.
    asking: bool = False
    # The drain is a move: the card (PCI address) it goes to, and those it leaves.
    move_to: str | None = Field(None, max_length=100)
    move_from: list[Annotated[str, Field(max_length=100)]] | None = Field(None, max_length=16)
    # The model IDs its lease had (``berth run --alias``): the gateway routes them to the front.
    aliases: list[Annotated[str, Field(min_length=1, max_length=200,
                                       pattern=r"^[^\s\x00-\x1f\x7f]+$")]] = \
        Field(default_factory=list, max_length=32)
    # When the drain happened (seconds since the epoch, the run's clock): a restarted berthd
    # learns the entry again and would otherwise say the engine was drained a moment ago.
    since: float | None = Field(None, ge=0, allow_inf_nan=False)


def _owner(request: web.Request, body: DrainedBody) -> ProcessId | None:
    """The run's process: ``owner_pid`` when the caller is it or its ancestor, else the caller.
    Raises 400 for an ``owner_pid`` that is not alive or not the caller's."""
    peer = peer_of(request)
    pid = body.owner_pid or (peer[0] if peer else None)
    if pid is None:
        return None
    owner = identify(pid)
    if owner is None:
        raise web.HTTPBadRequest(reason=f"owner_pid: no live process {pid}")
    if peer is not None and not is_self_or_descendant(owner.pid, peer[0]):
        raise web.HTTPBadRequest(reason=f"owner_pid: {owner.pid} is neither the caller "
                                        f"({peer[0]}) nor a process it started")
    return owner


def _engine(request: web.Request) -> str:
    """The engine named in the path. Raises 400 for a name a lease could not take."""
    name = request.match_info["engine"]
    if not 0 < len(name) <= 200 or not re.match(_ENGINE, name):
        raise web.HTTPBadRequest(reason=f"engine: expected a name without spaces, got {name!r}")
    return name


def _refused(runs: DrainedRuns, cfg, request: web.Request, engine: str) -> web.Response | None:
    """A 403 when another live run's process holds ``engine``'s entry and the caller is neither
    that process (or its ancestor) nor an operator."""
    old = runs.runs.get(engine)
    if old is None or old.owner is None or not alive(old.owner):
        return None
    peer = peer_of(request)
    if is_operator(cfg, peer) or is_self_or_descendant(old.owner.pid, peer[0]):
        return None
    return error(403, f"drained {engine}: the entry belongs to pid {old.owner.pid}", "forbidden")


def add_routes(app: web.Application, runs: DrainedRuns, cfg) -> None:
    """``PUT``, ``DELETE /v1/drained/{engine}`` and ``GET .../wake`` over ``runs`` (``cfg``:
    berthd's config, for who is an operator)."""

    async def put(request: web.Request) -> web.Response:
        engine = _engine(request)
        body: DrainedBody = await parse_body(request, DrainedBody)
        refused = _refused(runs, cfg, request, engine)
        if refused is not None:
            return refused
        owner = _owner(request, body)
        new = engine not in runs.runs
        run = runs.put(engine, body, owner, caller_of_request(request))
        if new:
            log.info("%s is drained; its run waits%s (%s)", engine,
                     f" behind {run.front}" if run.front else "", run.why)
        return web.json_response({"engine": engine, "since": run.since, "wake": run.wake_asked})

    async def wake(request: web.Request) -> web.Response:
        engine = _engine(request)
        timeout = query_number(request, "timeout", 25.0, 0.0, 600.0)
        refused = _refused(runs, cfg, request, engine)
        if refused is not None:
            return refused
        return web.json_response({"engine": engine, "wake": await runs.wait_wake(engine, timeout)})

    async def delete(request: web.Request) -> web.Response:
        engine = _engine(request)
        refused = _refused(runs, cfg, request, engine)
        if refused is not None:
            return refused
        return web.json_response({"engine": engine, "removed": runs.remove(engine)})

    app.router.add_put("/v1/drained/{engine}", put)
    app.router.add_delete("/v1/drained/{engine}", delete)
    app.router.add_get("/v1/drained/{engine}/wake", wake)
