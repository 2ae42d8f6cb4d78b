"""The board's listener closes slow and idle clients (issue 26 "Every listener closes slow and
idle clients"), against a real berthd serving its board on loopback: raw sockets, no client
library, so a request head can arrive a byte at a time.

- 20 connections sending a request head one byte every 2 s: none open after 30 s (each is
  answered 408 and closed once its head is 10 s late), and the board answers meanwhile;
- a kept-alive connection idle for ``[listeners] idle_timeout`` is closed;
- with ``[listeners] max_connections`` open, one more is answered 503 at once.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from tests.berthd import Berthd, sim_config, wait_for
from tests.helpers import log_at_the_fd_limit

HEAD = b"GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n\r\n"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def board(tmp_path):
    made = []

    def start(listeners: str = "") -> int:
        port = _port()
        extra = f'[board]\nlisten = "127.0.0.1:{port}"\n'
        if listeners:
            extra += f"[listeners]\n{listeners}\n"
        d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "8GiB")], extra=extra)).start()
        made.append(d)
        wait_for(lambda: _answers(port), 20, "the board to answer")
        return port
    yield start
    for d in made:
        d.stop()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _closed(s: socket.socket) -> bool:
    """Has the board closed ``s``? (Whatever it answered first, a 408 or a 503, is read.)"""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:                 # reset
        return True
    finally:
        s.setblocking(True)


def test_twenty_slow_heads_are_closed_and_the_board_answers_meanwhile(board):
    port = board()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
    stop = threading.Event()
    open_ = set(range(len(socks)))

    def drip():                     # one byte of each head every 2 s
        sent = 0
        while not stop.is_set() and open_ and sent < len(HEAD):
            for i in list(open_):
                try:
                    socks[i].send(HEAD[sent:sent + 1])
                except OSError:
                    open_.discard(i)
            sent += 1
            stop.wait(2.0)
    t = threading.Thread(target=drip, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        assert _answers(port)       # the board still serves others
        wait_for(lambda: all(_closed(s) for s in socks), 30, "every slow head closed")
        took = time.monotonic() - t0
        assert _answers(port)
    finally:
        stop.set()
        t.join(5)
        for s in socks:
            s.close()
    assert took <= 30, took


def test_an_idle_kept_alive_connection_is_closed(board):
    port = board('idle_timeout = "2s"')
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(HEAD)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        wait_for(lambda: _closed(s), 20, "the idle connection closed")


def test_connections_past_the_bound_get_a_503_at_once(board):
    port = board("max_connections = 4")
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    try:
        wait_for(lambda: _answers_over(port), 10, "a 503 for the fifth connection")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: _answers(port), 20, "the board to answer once they are gone")


def _answers_over(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(5)
        try:
            first = s.recv(200)
        except TimeoutError:
            return False
        assert first.startswith(b"HTTP/1.1 503"), first
        return True


_SERVE = """
import asyncio, logging, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (48, hard))
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from aiohttp import web
from berth.daemon.board_web.listen import GuardedSite, Limits
async def main():
    app = web.Application()
    app.router.add_get("/state", lambda r: web.json_response({}))
    runner = web.AppRunner(app)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, Limits(max_connections=10000))
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_too_many_open_files_is_logged_once_a_minute_not_per_accept(tmp_path):
    """As the front's listener does: the bound is set past the descriptor limit on purpose, so
    the board's accepts fail with EMFILE, which asyncio logged on every retry (once a second,
    a line each, with a traceback) until the board's listener throttled it too."""
    text = log_at_the_fd_limit(_SERVE, tmp_path)
    assert text.count("out of system resource") == 1, text[-3000:]
