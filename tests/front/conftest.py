"""Helpers for the front's tests: real aiohttp upstreams and fronts on 127.0.0.1, ephemeral ports.

Each test is a coroutine run by :func:`run` under a hard time limit. Waits are on events, or poll
observable state with a deadline (:func:`until`); nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web
from berth.front import Front
from multidict import CIMultiDict

from tests.helpers import free_port  # noqa: F401  (re-exported)

TEST_LIMIT_S = 30.0       # bounds a hang; a passing test takes well under a second


def run(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test function in a fresh event loop, failing after ``TEST_LIMIT_S``."""
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(TEST_LIMIT_S):
                await test(*args, **kwargs)
        asyncio.run(bounded())
    return wrapper


async def until(check: Callable[[], Any], what: str, timeout_s: float = 15.0) -> Any:
    """Poll ``check`` on the event loop until it is truthy; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (value := check()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)
    return value



class Upstream:
    """A real engine stand-in. ``routes`` map ``(method, path)`` to handlers; every request is
    recorded in ``seen`` as ``(method, raw_path, headers, body)``; handlers that end by
    cancellation or a reset record it in ``gone``."""

    def __init__(self, *, handler_cancellation: bool = True):
        self.app = web.Application(client_max_size=64 << 20)
        self.seen: list[tuple[str, str, CIMultiDict[str], bytes]] = []
        self.gone: list[str] = []
        self.gone_event = asyncio.Event()
        self.release = asyncio.Event()      # stream handlers wait on it after their first chunk
        self._cancellation = handler_cancellation
        self.runner: web.AppRunner | None = None
        self.url = ""
        self._routes: dict[tuple[str, str], Callable[[web.Request], Awaitable[Any]]] = {}
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)

    def route(self, method: str, path: str, handler: Callable[[web.Request], Awaitable[Any]]) -> None:
        """Serve ``method path`` with ``handler`` (may be called while running)."""
        self._routes[(method, path)] = handler

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.raw_path, request.headers.copy(), body))
        method = "GET" if request.method == "HEAD" else request.method
        handler = self._routes.get((method, request.path))
        if handler is None:
            raise web.HTTPNotFound()
        try:
            return await handler(request)
        except asyncio.CancelledError:
            self.gone.append("CancelledError")
            self.gone_event.set()
            raise
        except ConnectionResetError as exc:   # a write found the front gone
            self.gone.append(type(exc).__name__)
            self.gone_event.set()
            return web.Response(status=499)   # never delivered

    async def __aenter__(self) -> "Upstream":
        self.runner = web.AppRunner(self.app, handler_cancellation=self._cancellation,
                                    access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self.runner is not None
        await self.runner.cleanup()


def sse_handler(up: Upstream, n: int = 5) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An OpenAI-style chat stream of ``n`` chunks; it waits on ``up.release`` after the first."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for i in range(n):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                  "finish_reason": None if i < n - 1 else "stop"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if i == 0:
                await up.release.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp
    return handler


def json_handler(payload: dict | None = None, status: int = 200):
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(payload or {"ok": True, "path": request.path_qs}, status=status)
    return handler


@contextlib.asynccontextmanager
async def front_for(up: Upstream | None, *, state: str = "open", **kwargs: Any
                    ) -> AsyncIterator[Front]:
    """A started front on an ephemeral port, pointed at ``up``, moved to ``state``."""
    kwargs.setdefault("name", "test")
    kwargs.setdefault("wait_limit_s", 5.0)
    front = Front("127.0.0.1", 0, **kwargs)
    await front.start()
    try:
        if up is not None:
            front.set_upstream(up.url)
        if state in ("open", "closing", "asleep", "waking"):
            front.open()
        if state in ("closing", "asleep", "waking"):
            assert await front.close_and_drain(1.0)
        if state in ("asleep", "waking"):
            front.sleep()
        if state == "waking":
            front.waking()
        if state == "stopped":
            front.stopped()
        yield front
    finally:
        await front.stop()
