"""Issue 34: the engine's slots, read from its command line, its ``/props`` or berth.toml, decide
what ``berth run``'s front forwards at once (:mod:`berth.run.slots`). The real llama-server's
``/props`` is in ``tests/real/test_slots.py``; a live park with a backlog held in the front is in
``tests/broker/test_front_slots.py``."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web
from berth.config.models import EngineConfig
from berth.run.cli import RunOptions
from berth.run.slots import LLAMA_AUTO_SLOTS, Slots, from_command, from_props

from tests.front.conftest import front_for, run


@pytest.mark.parametrize("cmd, env, slots", [
    ("llama-server -m m.gguf -np 2 --port {port}", {}, 2),
    ("/opt/llama/bin/llama-server -m m.gguf --parallel 3", {}, 3),
    ("taskset -c 0-3 llama-server -m m.gguf -np 1 -np 6", {}, 6),        # the last one counts
    ("llama-server -m m.gguf", {"LLAMA_ARG_N_PARALLEL": "5"}, 5),
    ("llama-server -m m.gguf --parallel 2", {"LLAMA_ARG_N_PARALLEL": "5"}, 2),
    ("llama-server -m m.gguf", {}, LLAMA_AUTO_SLOTS),                    # automatic
    ("llama-server -m m.gguf -np -1", {}, LLAMA_AUTO_SLOTS),
    ("llama-server -m m.gguf -np x", {}, LLAMA_AUTO_SLOTS),              # its own error
    ("llama-server --models-dir /models -np 2", {}, None),               # router: per model
    ("vllm serve Qwen/Qwen3-8B --max-num-seqs 64", {}, 64),
    ("python -m vllm.entrypoints.openai.api_server --max-num-seqs=8", {}, 8),
    ("vllm serve Qwen/Qwen3-8B", {}, None),                              # its default varies
    ("python /opt/ComfyUI/main.py --listen 127.0.0.1 --port {port}", {}, 1),
    ("comfy launch -- --port {port}", {}, 1),
    ("berth sim engine --port {port} --weights 1GiB", {}, None),
    ("python serve.py --parallel 4", {}, None),        # not llama-server: not its flag
])
def test_slots_from_the_command_line(cmd, env, slots):
    n, source = from_command(cmd.split(), env)
    assert n == slots, (cmd, n, source)
    assert bool(source) == (slots is not None)


def _opts(cmd: str, declared: int | None = None) -> RunOptions:
    return RunOptions(cmd=cmd.split(), engine="A", max_in_flight=declared)


def test_declared_slots_win_over_the_entry_and_the_command_line():
    s = Slots(_opts("llama-server -m m.gguf -np 2", declared=7))
    s.declare(3)
    assert (s.n, s.source) == (7, "declared with --slots")
    s = Slots(_opts("llama-server -m m.gguf -np 2"))
    assert s.n == 2 and not s.declared
    s.declare(3)
    assert (s.n, s.source) == (3, "declared in [engines.A] slots")
    s.declare(None)
    assert s.n == 3


def test_an_engine_entry_declares_its_slots_and_refuses_fewer_than_one():
    assert EngineConfig(slots=2).slots == 2 and EngineConfig().slots is None
    for bad in (0, -1, "4", True):
        with pytest.raises(ValueError, match="slots"):
            EngineConfig(slots=bad)


class _Props:
    """An engine that answers ``GET /props`` with ``body`` (``status``)."""

    def __init__(self, body, status: int = 200):
        self.body, self.status = body, status

    async def __aenter__(self) -> str:
        app = web.Application()

        async def props(request: web.Request) -> web.Response:
            if isinstance(self.body, bytes):
                return web.Response(body=self.body, status=self.status)
            return web.json_response(self.body, status=self.status)
        app.router.add_get("/props", props)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


@pytest.mark.parametrize("body, status, slots", [
    ({"total_slots": 3, "model_alias": "m"}, 200, 3),
    ({"role": "router", "max_instances": 4}, 200, None),   # a router has no slots of its own
    ({"total_slots": 0}, 200, None),
    ({"total_slots": True}, 200, None),
    ({"total_slots": "4"}, 200, None),
    ([4], 200, None),
    (b"not json", 200, None),
    ({"error": "not found"}, 404, None),
])
def test_slots_from_props(body, status, slots):
    async def main():
        async with _Props(body, status) as url, aiohttp.ClientSession() as http:
            return await from_props(http, url)
    assert asyncio.run(main()) == slots


def test_no_engine_at_the_address_measures_nothing():
    from tests.helpers import free_port

    async def main():
        async with aiohttp.ClientSession() as http:
            return await from_props(http, f"http://127.0.0.1:{free_port()}")
    assert asyncio.run(main()) is None


@run
async def test_measured_slots_go_to_the_front_and_the_log_says_it_once(caplog):
    caplog.set_level(logging.INFO, "berth.run")
    s = Slots(_opts("berth sim engine --port {port} --weights 1GiB"))
    assert s.n is None
    async with _Props({"total_slots": 2}) as url, aiohttp.ClientSession() as http, \
            front_for(None, state="starting") as front:
        await s.measure(http, url)
        s.apply(front)
        s.apply(front)            # a second start of the same engine: said once
        assert front.max_in_flight == 2
    said = [r.getMessage() for r in caplog.records if "front forwards" in r.getMessage()]
    assert said == ["the front forwards at most 2 requests at once to A (measured: its /props "
                    "says total_slots); the rest wait in the front"], said


@run
async def test_an_unknown_engine_is_forwarded_everything_and_the_log_says_how_to_declare(caplog):
    caplog.set_level(logging.INFO, "berth.run")
    s = Slots(_opts("my-engine --port {port}"))
    async with _Props({"error": "no"}, 404) as url, aiohttp.ClientSession() as http, \
            front_for(None, state="starting", max_in_flight=3) as front:
        await s.measure(http, url)
        s.apply(front)
        s.apply(front)
        assert front.max_in_flight is None
    said = [r.getMessage() for r in caplog.records if "front forwards" in r.getMessage()]
    assert len(said) == 1 and "forwards every request to A" in said[0] \
        and "berth run --slots N" in said[0] and "[engines.A] slots = N" in said[0], said


@run
async def test_declared_slots_are_not_measured():
    s = Slots(_opts("llama-server -m m.gguf", declared=1))
    async with _Props({"total_slots": 4}) as url, aiohttp.ClientSession() as http:
        await s.measure(http, url)
    assert (s.n, s.source) == (1, "declared with --slots")
