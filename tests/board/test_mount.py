"""The board outside the browser: its config, a taken port, and mounted in another aiohttp app
over berthd's control socket (as the gateway mounts it). Real berthd, real sockets."""

from __future__ import annotations

import asyncio
import os
import socket

import aiohttp
import pytest
from aiohttp import web
from berth.config import ConfigError, parse
from berth.daemon.board_web import CSP, Hub, SocketSource, board_app

from tests.berthd import Berthd, api, sim_config, wait_for


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_board_config():
    assert parse({}).board.listen == "127.0.0.1:7088"          # loopback by default
    assert parse({}).board.key is None                         # read-only by default
    assert parse({"board": {"listen": "off"}}).board.listen is None
    with pytest.raises(ConfigError) as e:
        parse({"board": {"listen": "everywhere", "key": "short"}})
    text = str(e.value)
    assert "board.listen" in text and "everywhere" in text and "board.key" in text


def test_a_taken_port_leaves_berthd_running_without_the_board(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = sim_config(tmp_path, [("gpu0", "8GiB")],
                         extra=f'[board]\nlisten = "127.0.0.1:{port}"\n')
        d = Berthd(tmp_path, cfg).start()
        try:
            assert d.status()["cards"][0]["name"] == "gpu0"
            wait_for(lambda: "the board cannot listen on 127.0.0.1:" in d.log.read_text(),
                     5, "the warning")
        finally:
            d.stop()
        assert d.proc.returncode == 0


def test_mounted_over_the_control_socket(tmp_path):
    cfg = sim_config(tmp_path, [("gpu0", "8GiB")], extra='[board]\nlisten = "off"\n')
    d = Berthd(tmp_path, cfg).start()
    try:
        code, out = api(d.sock, "POST", "/v1/leases", {
            "engine": "mounted", "owner_pid": os.getpid(),
            "shares": [{"card": "gpu0", "size": "1GiB"}]})
        assert code == 201, out
        asyncio.run(_mounted(d, _port()))
    finally:
        d.stop()
    assert "board on http" not in d.log.read_text()                # listen = "off"


async def _mounted(d: Berthd, port: int) -> None:
    hub = Hub(SocketSource(d.sock), tick_s=0.2)
    await hub.start()
    app = web.Application()
    app.add_subapp("/board/", board_app(hub, "a-key-of-sixteen-chars"))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}/board/"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base) as r:
                assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP
                assert 'src="static/page.js"' in await r.text()     # relative: any prefix
            async with s.get(base + "static/page.js") as r:
                assert r.status == 200
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                async with s.get(base + "state") as r:
                    doc = await r.json()
                board = doc["board"]
                if board and any(le["engine"] == "mounted" for le in board["status"]["leases"]):
                    break
                assert asyncio.get_running_loop().time() < deadline, doc
                await asyncio.sleep(0.05)
            assert doc["operator"] is False
            # JSON nested too deep for the parser, before any key is checked: a 400 (it was a
            # 500 with a traceback in berthd's log).
            async with s.post(base + "login", data=b"[" * 60_000) as r:
                assert r.status == 400, await r.text()
            async with s.post(base + "operator/park", json={"target": "mounted"},
                              headers={"X-Berth-Board": "1"}) as r:
                assert r.status == 403
            async with s.post(base + "operator/hold", json={"target": "mounted"},
                              headers={"Authorization": "Bearer a-key-of-sixteen-chars"}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["by"] == "bearer key"
        assert d.lease_of("mounted")["held"] is True
    finally:
        await hub.stop()
        await runner.cleanup()
