"""The Berth engine protocol on ComfyUI's own port: ``/berth/v1/park``, ``/wake``, ``/state``.

Source: DESIGN.md "The Berth engine protocol"; issue 13 ("add the Berth engine protocol
routes"). ComfyUI serves each route twice, as ``/berth/v1/x`` and ``/api/berth/v1/x``.

The agent carries out berthd's instructions itself (it holds ComfyUI's lease); these routes let
any other caller that speaks the protocol (``berth run --park hook`` in front of a ComfyUI, an
operator with curl) do the same, through the same steps. A 200 is never proof: berthd confirms
a park with a driver read (rule 1).

Park and wake change state, and a web page elsewhere can send a browser's "simple" cross-site
POST to ComfyUI's port without asking first (issue 26): a request whose ``Origin`` is not
on the allow-list (:func:`cross_site`; not compared with ``Host``: issue 36), or whose
``Sec-Fetch-Site`` says cross-site, gets a 403. Callers that are not
browsers send no ``Origin`` and pass.
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web
from berth.origin import refusal

from .states import GateState

__all__ = ["add_routes", "cross_site"]


def cross_site(request: web.Request, allowed: tuple[str, ...] | None = None) -> str | None:
    """Why ``request`` comes from another site's page (``None``: it does not): an ``Origin``
    that is not on the allow-list (:func:`berth.origin.refusal`: ``[listeners] origins``, this
    machine's loopback or the address the connection came in on, with ComfyUI's port; never
    compared with ``Host``, which a rebound name's page chooses: issue 36), or the browser says
    ``Sec-Fetch-Site: cross-site``. ``allowed``: the configured origins (default: berth.toml's,
    read once)."""
    t = request.transport
    sockname = t.get_extra_info("sockname") if t is not None else None
    origins = allowed if allowed is not None else _configured()
    for origin in request.headers.getall("Origin", []):
        why = refusal(origin, sockname, origins)
        if why is not None:
            return why
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        return "Sec-Fetch-Site: cross-site"
    return None


@functools.cache
def _configured() -> tuple[str, ...]:
    """berth.toml's ``[listeners] origins``; none where it cannot be read (loopback still
    passes)."""
    from berth.config import ConfigError, load_config
    try:
        return tuple(load_config()[0].listeners.origins)
    except (ConfigError, OSError):
        return ()


def _refused(request: web.Request) -> web.Response | None:
    why = cross_site(request)
    if why is None:
        return None
    return web.json_response({"error": {"message": f"{request.path} refused: {why}; park and "
                                                   f"wake are not for other sites' pages",
                                        "type": "forbidden", "code": 403}}, status=403)


def add_routes(routes: web.RouteTableDef, agent) -> None:
    """Register the protocol's routes on ComfyUI's ``PromptServer.instance.routes``."""

    @routes.post("/berth/v1/park")
    async def park(request: web.Request) -> web.Response:
        refused = _refused(request)
        if refused is not None:
            return refused
        ok, detail = await asyncio.wrap_future(agent.call(agent.park()))
        if not ok:
            return web.json_response({"error": {"message": detail, "type": "park_failed",
                                                "code": 409}}, status=409)
        return web.json_response({"state": "parked"})

    @routes.post("/berth/v1/wake")
    async def wake(request: web.Request) -> web.Response:
        refused = _refused(request)
        if refused is not None:
            return refused
        if not await asyncio.wrap_future(agent.call(agent.wake())):
            return web.json_response({"error": {"message": agent.gate.stop_reason,
                                                "type": "drained", "code": 409}}, status=409)
        return web.json_response({"state": "active"})

    @routes.get("/berth/v1/state")
    async def state(request: web.Request) -> web.Response:
        g = agent.gate
        st = "parked" if g.state in (GateState.ASLEEP, GateState.WAKING) else "active"
        busy = g.in_flight + agent.queue.get_tasks_remaining()
        return web.json_response({"state": st, "lent": {}, "in_flight": busy,
                                  "berth": agent.status()})
