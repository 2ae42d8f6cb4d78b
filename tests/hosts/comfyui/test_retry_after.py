"""The gate's 503s say when to come back as the run's front does (core/front/rules.py): 1 s
while the wait may end soon, RETRY_LASTING_S when berthd says nothing under way can end it (a
retry every second would only loop). The gate serves a real aiohttp app on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import types
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from berth.front.rules import RETRY_LASTING_S
from berth_hosts.comfyui.agent import Agent
from berth_hosts.comfyui.gate import Gate, GateState

G = GateState
CAUSE = "the card is held by chat-14 (priority 10) and no job under way can end that"


@contextlib.asynccontextmanager
async def served(gate: Gate) -> AsyncIterator[str]:
    async def queued(request: web.Request) -> web.Response:
        return web.json_response({"prompt_id": "p1", "number": 1, "node_errors": {}})
    app = web.Application(middlewares=[gate.middleware])
    app.router.add_post("/prompt", queued)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _refused(gate: Gate) -> tuple[int, str | None, dict]:
    async with served(gate) as url, aiohttp.ClientSession() as s, \
            s.post(url + "/prompt", json={"prompt": {}}) as r:
        return r.status, r.headers.get("Retry-After"), await r.json()


@pytest.mark.parametrize("lasting, retry", [(True, str(RETRY_LASTING_S)), (False, "1")])
def test_a_held_prompt_refused_at_the_wait_limit_says_when_to_retry(lasting: bool, retry: str):
    gate = Gate(wait_limit_s=0.3)
    gate.move(G.STARTING, "registered")
    gate.cause, gate.lasting = CAUSE, lasting
    status, after, body = asyncio.run(_refused(gate))
    assert status == 503 and body["error"]["details"] == "wait_limit", body
    assert after == retry


@pytest.mark.parametrize("lasting, retry", [(True, str(RETRY_LASTING_S)), (False, "1")])
def test_a_prompt_refused_by_the_growth_check_says_when_to_retry(lasting: bool, retry: str):
    async def no_room(body) -> str:
        return "berthd did not grant 2.0GiB more within the wait limit (0.3 s)"
    gate = Gate(before_write=no_room)
    gate.move(G.OPEN, "granted")
    gate.cause, gate.lasting = CAUSE, lasting
    status, after, body = asyncio.run(_refused(gate))
    assert status == 503 and "could not make room" in body["error"]["message"], body
    assert after == retry


def test_the_agent_takes_lasting_from_berthds_wait_and_a_drain_keeps_1_s():
    agent = types.SimpleNamespace(gate=Gate(wait_limit_s=0.3), wait_version=0)
    Agent._follow_wait(agent, {"why": CAUSE, "lasting": True, "version": 3})
    assert agent.gate.lasting is True and agent.gate.cause == CAUSE
    Agent._follow_wait(agent, {"why": "a park under way", "lasting": False, "version": 4})
    assert agent.gate.lasting is False
    Agent._follow_wait(agent, {"why": CAUSE, "lasting": True, "version": 5})
    agent.gate.stop("drained by Berth")    # not a wait: a drained ComfyUI's 503 stays 1 s
    assert asyncio.run(_refused(agent.gate))[1] == "1"
