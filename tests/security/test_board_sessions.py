"""The board's operator sessions (issue 26, Low): random at each sign-in, expiring
(``[board] session_limit``, default 8 h), ended by sign-out, scoped to the board's path, and
never relayed by a front or the gateway to an engine.

The board here is berthd's own board app (:mod:`berth.daemon.board_web`) served in this process by
:func:`berth.daemon.board_web.serve` (as berthd serves it) and mounted at ``/board/`` in another
aiohttp app (as the gateway mounts it); sign-in needs no berthd. The relay is checked through a
real front (the one ``berth run`` and the gateway build) and a real ``berth gateway``.
"""

from __future__ import annotations

import asyncio
import http.cookies
import subprocess

import aiohttp
from aiohttp import web
from berth.daemon.board_web import Hub, Limits, SocketSource, board_app, serve

from tests.berthd import BERTH, Berthd, sim_config, wait_for
from tests.front.conftest import Upstream, front_for, json_handler, run
from tests.gateway.world import free_port, http

KEY = "board-key-for-tests-0123456789"


async def _login(s: aiohttp.ClientSession, url: str) -> http.cookies.Morsel:
    async with s.post(url + "login", json={"name": "ada", "key": KEY}) as r:
        assert r.status == 200, await r.text()
        return r.cookies["berth_board"]


async def _operator(s: aiohttp.ClientSession, url: str, token: str | None) -> bool:
    headers = {"Cookie": f"berth_board={token}"} if token else {}
    async with s.get(url + "state", headers=headers) as r:
        return (await r.json())["operator"]


@run
async def test_sessions_are_random_expire_and_end_at_sign_out():
    hub = Hub(SocketSource("/nonexistent/berthd.sock"))
    port = free_port()
    runner = await serve(hub, f"127.0.0.1:{port}", KEY, Limits(), session_s=3.0)
    url = f"http://127.0.0.1:{port}/"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            one, two = await _login(s, url), await _login(s, url)
            assert one.value != two.value                       # a new session each sign-in
            assert "ada" not in one.value and len(one.value) >= 40
            assert one["path"] == "/" and one["httponly"] and one["samesite"] == "Strict"
            assert one["max-age"] == "3"
            assert await _operator(s, url, one.value) and await _operator(s, url, two.value)
            assert not await _operator(s, url, "ada:" + "0" * 64)      # the old, forged shape
            async with s.post(url + "logout", headers={"Cookie": f"berth_board={one.value}"}) \
                    as r:
                assert r.status == 200
                assert r.cookies["berth_board"]["path"] == "/"
            assert not await _operator(s, url, one.value)       # ended at sign-out
            assert await _operator(s, url, two.value)           # the other one lives on
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 8.0
            while await _operator(s, url, two.value):           # until its 3 s are over
                assert loop.time() < deadline, "the session did not expire"
                await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()


@run
async def test_a_session_under_the_gateways_mount_is_scoped_to_board():
    app = web.Application()
    app.add_subapp("/board/", board_app(Hub(SocketSource("/nonexistent/berthd.sock")), KEY))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            cookie = await _login(s, f"http://127.0.0.1:{port}/board/")
            assert cookie["path"] == "/board", cookie.OutputString()
            assert cookie["max-age"] == str(8 * 3600)                  # the default, 8 h
    finally:
        await runner.cleanup()


@run
async def test_a_front_relays_no_board_cookie():
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", json_handler())
        for sent, seen in (("berth_board=secret; theme=dark", "theme=dark"),
                           ("theme=dark; berth_board=secret", "theme=dark"),
                           ("berth_board=secret", None)):
            async with s.post(front.url + "/v1/chat/completions", data=b"{}",
                              headers={"Cookie": sent}) as r:
                assert r.status == 200
            assert up.seen[-1][2].get("Cookie") == seen, (sent, up.seen[-1][2])


def test_the_gateway_relays_no_board_cookie(tmp_path):
    """A ``berth gateway`` sends a model's request to an engine entry's ``url``: the engine
    sees every cookie but the board's."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen: list[str | None] = []

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Cookie"))
            body = b'{"choices": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    engine = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    cfg = sim_config(tmp_path, [("gpu0", "8GiB")],
                     extra=f'[board]\nlisten = "off"\n[engines.echo]\n'
                           f'url = "http://127.0.0.1:{engine.server_address[1]}"\n')
    d = Berthd(tmp_path, cfg).start()
    port = free_port()
    gw = subprocess.Popen([BERTH, "gateway", "--listen", f"127.0.0.1:{port}", "--config",
                           str(cfg)], env=d.env, stdout=open(tmp_path / "gw.log", "ab"),
                          stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _up(port), 30, "the gateway")
        code, doc, _ = http(port, "POST", "/v1/chat/completions",
                            {"model": "echo", "messages": []},
                            headers={"Cookie": "a=1; berth_board=secret; b=2"})
        assert code == 200, doc
        assert seen == ["a=1; b=2"], seen
    finally:
        gw.terminate()
        gw.wait(10)
        d.stop()
        engine.shutdown()


def _up(port: int) -> bool:
    try:
        return http(port, "GET", "/v1/models", timeout=2)[0] == 200
    except OSError:
        return False
