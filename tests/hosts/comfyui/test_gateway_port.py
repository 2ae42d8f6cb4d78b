"""``berth gateway --comfyui-listen`` before the ComfyUI stand-in with the node, under a real
berthd: the page's ``/ws`` and ``POST /prompt`` pass through, and a park with that websocket open
and idle is not held up (issue 14 "Acceptance", third line; llama-swap #1001/#1137)."""

from __future__ import annotations

import asyncio
import subprocess

import aiohttp
from berth.sim.ports import free_ports

from tests.berthd import BERTH, wait_for

from .conftest import http, prompt

SD15 = ("CheckpointLoaderSimple", "ckpt_name", "sd15.safetensors")


def test_a_park_with_an_idle_websocket_open_through_the_port_is_not_held_up(world):
    d = world.berthd()
    c = world.comfyui()
    wait_for(lambda: d.state_of("comfyui") == "active" and c.berth()["gate"]["state"] == "open",
             10, "ComfyUI leased")
    gw_port = free_ports(2)             # two ports, never the same one twice
    port = gw_port + 1
    log = world.tmp / "gateway.log"
    gw = subprocess.Popen(
        [BERTH, "gateway", "--listen", f"127.0.0.1:{gw_port}", "--comfyui-listen",
         f"127.0.0.1:{port}", "--config", str(d.config)],
        env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    world.procs.append(gw)

    def gateway() -> dict | None:
        # It answers only once the ComfyUI port listens too (berth.gateway.server's start).
        if gw.poll() is not None:
            raise AssertionError(f"the gateway exited {gw.returncode}:\n{log.read_text()}")
        try:
            code, doc = http("GET", f"http://127.0.0.1:{gw_port}/berth/v1/gateway", timeout=2)
        except OSError:
            return None
        return doc["comfyui_port"] if code == 200 else None
    wait_for(gateway, 20, "the gateway to answer")
    asyncio.run(_through_the_port(d, c, f"http://127.0.0.1:{port}", gateway))


async def _through_the_port(d, c, base: str, counters) -> None:
    async def until(pred, what: str, timeout_s: float = 15.0):
        return await asyncio.to_thread(wait_for, pred, timeout_s, what)

    async with aiohttp.ClientSession() as s:
        ws = await s.ws_connect(base + "/ws?clientId=page")
        hello = await ws.receive_json(timeout=10)
        assert hello["type"] == "status" and hello["data"]["sid"] == "page", hello
        async with s.post(base + "/prompt", json=prompt(SD15)) as r:
            assert r.status == 200, await r.text()
            first = (await r.json())["prompt_id"]
        await until(lambda: c.done(first), "the first prompt")
        await until(lambda: counters()["websockets"] == 1 and counters()["in_flight"] == 0,
                    "the port to count the websocket, and no request in flight")

        # The park, with the page's websocket open and idle: parked by the node, not held up
        # until release_grace and drained.
        code, ans = await asyncio.to_thread(d.call, "POST", "/v1/operator/park",
                                            {"target": "comfyui"})
        assert code == 200, ans
        await until(lambda: d.state_of("comfyui") == "parked", "ComfyUI parked")
        kinds = [e["kind"] for e in d.timeline()]
        assert "fallback" not in kinds and "drain" not in kinds, kinds
        assert not ws.closed

        # A prompt through the port while parked wakes ComfyUI and runs; the socket still open.
        async with s.post(base + "/api/prompt", json=prompt(SD15)) as r:
            assert r.status == 200, await r.text()
            held = (await r.json())["prompt_id"]
        await until(lambda: d.state_of("comfyui") == "active", "ComfyUI woken")
        st = await until(lambda: c.done(held), "the prompt after the wake")
        assert st["status_str"] == "success"
        assert not ws.closed and counters()["websockets"] == 1
        await ws.close()
        await until(lambda: counters()["websockets"] == 0, "the websocket closed at the port")
