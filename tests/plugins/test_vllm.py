"""The vLLM plugin against a small server speaking vLLM's sleep-mode routes as the reference
describes them (reference/park-mechanisms.md "vLLM sleep mode"). The fake holds its bytes on a
simulated card and, like vLLM's sleep route (its FIXME), answers before the memory is free."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from aiohttp import web
from berth.driver import UseAtMost, confirm

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

from .conftest import PCI, GiB, MiB, ctx, serve

RESIDUAL = 1200 * MiB   # context and graph pools stay (vllm#28714)
WEIGHTS = 6 * GiB


class FakeVLLM:
    """``POST /sleep`` answers 200 at once; ``is_sleeping`` turns true two polls later; the bytes
    leave the card only when the test sets ``release`` (the driver read must wait for it)."""

    def __init__(self, store, *, wake_error: str | None = None, never_sleeps: bool = False):
        self.store, self.pid = store, os.getpid()
        self.sleeping, self.polls_until_asleep = False, None
        self.wake_error, self.never_sleeps = wake_error, never_sleeps
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        store.alloc(PCI, RESIDUAL + WEIGHTS, self.pid)

    async def _free_later(self) -> None:
        await self.release.wait()
        self.store.free(PCI, WEIGHTS, self.pid)

    async def sleep(self, request: web.Request) -> web.Response:
        self.calls.append(f"sleep level={request.query.get('level')} mode={request.query.get('mode')}")
        self.polls_until_asleep = None if self.never_sleeps else 2
        task = asyncio.create_task(self._free_later())
        self.tasks.add(task)
        return web.Response(status=200)   # empty, before the sleep is done

    async def is_sleeping(self, request: web.Request) -> web.Response:
        self.calls.append("is_sleeping")
        if self.polls_until_asleep is not None:
            self.polls_until_asleep -= 1
            if self.polls_until_asleep <= 0:
                self.sleeping, self.polls_until_asleep = True, None
        return web.json_response({"is_sleeping": self.sleeping})

    async def wake_up(self, request: web.Request) -> web.Response:
        self.calls.append("wake_up" + (f"?{request.query_string}" if request.query_string else ""))
        if self.wake_error:
            return web.json_response({"object": "error", "message": self.wake_error,
                                      "type": "InternalServerError", "code": 500}, status=500)
        self.store.alloc(PCI, WEIGHTS, self.pid)
        self.sleeping = False
        return web.Response(status=200)

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(f"completion model={body['model']} max_tokens={body['max_tokens']}")
        return web.json_response({"choices": [{"text": "x"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/sleep", self.sleep)
        app.router.add_get("/is_sleeping", self.is_sleeping)
        app.router.add_post("/wake_up", self.wake_up)
        app.router.add_post("/v1/completions", self.completions)
        return app


@pytest.fixture
def pm():
    return make_plugin_manager(load_entry_points=False)


def test_park_returns_without_claiming_the_memory_is_free_and_wake_warms_up(kit, pm):
    async def scenario():
        fake = FakeVLLM(kit.store)
        async with serve(fake.app()) as url:
            await run_action(pm, "berth_park", ctx("vllm", engine_url=url))
            assert fake.calls[:1] == ["sleep level=1 mode=wait"]
            assert fake.calls.count("is_sleeping") == 2 and fake.sleeping
            # the plugin returned; the card still holds the weights: only a driver read decides
            assert kit.driver.read(PCI).processes[fake.pid] == RESIDUAL + WEIGHTS
            fake.release.set()
            event = UseAtMost(frozenset({fake.pid}), max_bytes=RESIDUAL)
            reading = await confirm(kit.driver, PCI, event, deadline=time.monotonic() + 5)
            assert reading is not None and reading.processes[fake.pid] == RESIDUAL

            fake.calls.clear()
            await run_action(pm, "berth_wake", ctx("vllm", engine_url=url, room_confirmed=True,
                                                   options={"warmup_model": "qwen"}))
            assert fake.calls == ["wake_up", "is_sleeping", "completion model=qwen max_tokens=1"]
            assert kit.driver.read(PCI).processes[fake.pid] == RESIDUAL + WEIGHTS
    asyncio.run(scenario())


def test_dev_mode_off_is_a_clear_error(kit, pm):
    async def scenario():
        async with serve(web.Application()) as url:   # no sleep routes at all: 404
            for hook, extra in (("berth_park", {}), ("berth_wake", {"room_confirmed": True})):
                with pytest.raises(MechanismError) as e:
                    await run_action(pm, hook, ctx("vllm", engine_url=url, **extra))
                msg = str(e.value)
                assert "sleep mode routes are absent (404)" in msg
                assert "VLLM_SERVER_DEV_MODE=1" in msg and "--enable-sleep-mode" in msg
    asyncio.run(scenario())


def test_wake_error_quotes_vllm_and_a_sleep_that_never_settles_fails_in_time(kit, pm):
    async def scenario():
        fake = FakeVLLM(kit.store, wake_error="CUDA out of memory. Tried to allocate 6.00 GiB")
        async with serve(fake.app()) as url:
            with pytest.raises(MechanismError, match="POST /wake_up answered 500: CUDA out of "
                                                     "memory. Tried to allocate 6.00 GiB"):
                await run_action(pm, "berth_wake", ctx("vllm", engine_url=url,
                                                       room_confirmed=True))
        stuck = FakeVLLM(kit.store, never_sleeps=True)
        async with serve(stuck.app()) as url:
            # 3 s: time for the reads to happen on a loaded machine (with 0.5 s the budget could
            # run out before the first read answered, a different error)
            with pytest.raises(MechanismError, match="/is_sleeping still read false within 3 s"):
                await run_action(pm, "berth_park", ctx("vllm", engine_url=url, timeout_s=3.0))
        for task in fake.tasks | stuck.tasks:
            task.cancel()
    asyncio.run(scenario())
