"""The Ollama adapter against the simulation kit's stand-in (``berth sim ollama``, a real
process on a simulated 24 GiB card), and the stand-in's own answers. Neither has run against a
real Ollama: both follow Ollama's API documentation (``/api/ps``, ``keep_alive``, the unload
request, ``OLLAMA_HOST``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import pytest
from aiohttp import web
from berth.driver import UseAtMost, confirm

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action
from tests.helpers import ceiling, wait_for

from ..sim.conftest import free_port, http
from .conftest import PCI, GiB, ctx, serve

UNLOAD_DELAY_S = 1.0


class StandIn:
    """``berth sim ollama`` with two models, started as ``ollama serve`` is (OLLAMA_HOST)."""

    def __init__(self, kit, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = kit.tmp / f"ollama-{self.port}.log"
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "berth.cli", "sim", "ollama", "--model", "qwen3:8b=5GiB",
                 "--model", "gemma3=3GiB", "--card", "gpu0", "--unload-delay",
                 str(UNLOAD_DELAY_S), *flags],
                env=dict(kit.env, OLLAMA_HOST=f"127.0.0.1:{self.port}"), stdout=f,
                stderr=subprocess.STDOUT)
        kit.engines.append(self)           # stopped with the kit's engines
        wait_for(self.up, 20, "the Ollama stand-in to listen")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(self.log.read_text())
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1) as r:
                return r.read() == b"Ollama is running"
        except OSError:
            return False

    def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        return http(method, self.url + path, body)

    def loaded(self) -> list[str]:
        return [m["model"] for m in self.call("GET", "/api/ps")[1]["models"]]


def _on_card(kit, pid: int) -> int:
    return kit.driver.read(PCI).processes.get(pid) or 0


@pytest.fixture
def pm():
    return make_plugin_manager(load_entry_points=False)


def test_the_stand_in_loads_lists_and_unloads_as_ollama_documents(kit):
    ol = StandIn(kit)
    assert {m["name"] for m in ol.call("GET", "/api/tags")[1]["models"]} == {
        "qwen3:8b", "gemma3:latest"}
    code, ans = ol.call("POST", "/api/generate", {"model": "qwen3:8b"})      # load only
    assert code == 200 and ans["done"] and ans["done_reason"] == "load", ans
    code, ans = ol.call("POST", "/api/chat", {"model": "gemma3", "stream": False,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and ans["done_reason"] == "stop" and ans["message"]["content"], ans
    assert sorted(ol.loaded()) == ["gemma3:latest", "qwen3:8b"]
    ps = ol.call("GET", "/api/ps")[1]["models"]
    assert {m["size_vram"] for m in ps} == {5 * GiB, 3 * GiB} and all(m["expires_at"] for m in ps)
    assert _on_card(kit, ol.pid) == 8 * GiB
    code, ans = ol.call("POST", "/api/generate", {"model": "qwen3:8b", "keep_alive": 0})
    assert code == 200 and ans["done_reason"] == "unload" and ans["response"] == "", ans
    assert ol.loaded() == ["gemma3:latest"]            # gone from /api/ps at once ...
    assert _on_card(kit, ol.pid) == 8 * GiB            # ... its memory a little later
    wait_for(lambda: _on_card(kit, ol.pid) == 3 * GiB, 10, "qwen's memory off the card")
    code, ans = ol.call("POST", "/api/chat", {"model": "gemma3", "messages": [],
                                             "keep_alive": "0"})
    assert code == 200 and ans["done_reason"] == "unload"
    code, ans = ol.call("POST", "/v1/chat/completions", {
        "model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and ans["choices"][0]["message"]["content"], ans
    code, ans = ol.call("POST", "/api/generate", {"model": "llama9", "prompt": "x"})
    assert code == 404 and ans == {"error": "model 'llama9' not found"}
    code, ans = ol.call("POST", "/api/generate", {"model": "qwen3:8b", "keep_alive": "soon"})
    assert code == 400 and "keep_alive" in ans["error"]


def test_keep_alive_runs_out(kit):
    ol = StandIn(kit)
    assert ol.call("POST", "/api/generate", {"model": "gemma3", "keep_alive": "0.3s"})[0] == 200
    assert ol.loaded() == ["gemma3:latest"]
    wait_for(lambda: not ol.loaded(), 10, "gemma3 unloaded by its keep_alive")
    wait_for(lambda: _on_card(kit, ol.pid) == 0, 10, "its memory off the card")


def test_park_unloads_every_model_and_leaves_the_freeing_to_the_driver_read(kit, pm):
    ol = StandIn(kit)
    for model in ("qwen3:8b", "gemma3"):
        assert ol.call("POST", "/api/generate", {"model": model, "keep_alive": -1})[0] == 200
    assert _on_card(kit, ol.pid) == 8 * GiB

    async def scenario():
        t0 = time.monotonic()
        await run_action(pm, "berth_park", ctx("ollama", engine_url=ol.url))
        assert ol.loaded() == []
        # The plugin returned; the runner's memory is still there: only a driver read decides.
        assert _on_card(kit, ol.pid) == 8 * GiB and time.monotonic() - t0 < UNLOAD_DELAY_S
        reading = await confirm(kit.driver, PCI, UseAtMost(frozenset({ol.pid}), max_bytes=0),
                                deadline=time.monotonic() + 10)
        assert reading is not None and not reading.processes.get(ol.pid)
        await run_action(pm, "berth_wake", ctx("ollama", engine_url=ol.url,
                                               room_confirmed=True))
        assert ol.loaded() == [] and _on_card(kit, ol.pid) == 0       # wake loads nothing
    asyncio.run(scenario())
    code, _ = ol.call("POST", "/api/chat", {"model": "qwen3:8b", "stream": False,
                                           "messages": [{"role": "user", "content": "back"}]})
    assert code == 200 and ol.loaded() == ["qwen3:8b"] and _on_card(kit, ol.pid) == 5 * GiB


def test_park_of_an_idle_ollama_is_quick_and_errors_quote_ollama(kit, pm):
    ol = StandIn(kit)
    asyncio.run(run_action(pm, "berth_park", ctx("ollama", engine_url=ol.url)))   # none loaded

    async def broken(request):
        return web.json_response({"error": "something went wrong"}, status=500)

    async def stuck_ps(request):
        return web.json_response({"models": [{"name": "qwen3:8b", "model": "qwen3:8b"}]})

    async def unload(request):
        assert (await request.json())["keep_alive"] == 0
        return web.json_response({"done": True, "done_reason": "unload"})

    async def scenario():
        app = web.Application()
        app.router.add_get("/api/ps", broken)
        async with serve(app) as url:
            with pytest.raises(MechanismError, match="GET /api/ps answered 500: something went"):
                await run_action(pm, "berth_park", ctx("ollama", engine_url=url))
        app = web.Application()
        app.router.add_get("/api/ps", stuck_ps)
        app.router.add_post("/api/generate", unload)
        async with serve(app) as url:
            # The bound scales by the machine's slowness: on a loaded machine a 1 s bound ran
            # out inside a GET, and the error named the GET, not the model still listed.
            bound = ceiling(1.0)
            t0 = time.monotonic()
            with pytest.raises(MechanismError, match="still lists qwen3:8b"):
                await run_action(pm, "berth_park", ctx("ollama", engine_url=url,
                                                       timeout_s=bound))
            assert time.monotonic() - t0 < 5 * bound
    asyncio.run(scenario())


@pytest.mark.expect_oom          # on purpose: a model larger than the card
def test_the_stand_in_refuses_what_it_cannot_load(kit):
    ol = StandIn(kit, "--model", "huge=30GiB")
    code, ans = ol.call("POST", "/api/generate", {"model": "huge"})
    assert code == 500 and "30.0GiB" in ans["error"], ans
    assert kit.store.snapshot().cards[0].oom_events == 1
    assert json.loads(json.dumps(ol.call("GET", "/api/ps")[1])) == {"models": []}


def test_berthd_parks_and_wakes_ollama_and_grants_the_waiter_only_after_the_driver_read(
        tmp_path):
    """The acceptance line: ``berth run --park hook --adapter ollama`` around the stand-in (as
    around ``ollama serve``); a waiter that needs its room gets it only once a driver read shows
    the unloaded model's memory gone (the stand-in frees it 2 s after it answered the unload),
    and a request at the front afterwards wakes it and loads the model again."""
    from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    front = free_port()
    runs = [subprocess.Popen(
        [BERTH, "run", "--engine", "ollama", "--front", f"127.0.0.1:{front}", "--size",
         "10GiB", "--park", "hook", "--adapter", "ollama", "--health", "/api/version", "--",
         "env", "OLLAMA_HOST=127.0.0.1:{port}", BERTH, "sim", "ollama",
         "--model", "qwen3:8b=8GiB", "--unload-delay", "2"],
        env=d.env, stdout=open(tmp_path / "run-ollama.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)]
    url = f"http://127.0.0.1:{front}"
    chat = {"model": "qwen3:8b", "stream": False,
            "messages": [{"role": "user", "content": "hello"}]}
    try:
        wait_for(lambda: (d.lease_of("ollama") or {}).get("ready"), 30, "ollama serving")
        code, ans = http("POST", url + "/api/chat", chat, timeout_s=30)
        assert code == 200 and ans["message"]["content"], ans
        pid = d.lease_of("ollama")["pid"]
        from berth.sim.cards import SimCards
        sim = SimCards(tmp_path / "sim")

        def held() -> int:
            return sim.snapshot().cards[0].processes.get(pid) or 0
        assert held() == 8 * GiB
        runs.append(berth_run(d, "B", "--size", "16GiB", weights="12GiB"))
        early: list[str] = []

        def b_active():
            b = d.lease_of("B")
            granted = b is not None and b["shares"][0]["state"] == "active"
            if granted and held():
                early.append(f"B granted beside ollama's {held()} bytes")
            return early or granted
        wait_for(b_active, 60, "B granted once ollama's memory left the card")
        assert not early, early
        assert d.state_of("ollama") == "parked"
        seen = [(e["kind"], e.get("engine")) for e in d.timeline()]
        assert seen.index(("parked", "ollama")) < seen.index(("grant", "B")), seen
        log = (tmp_path / "run-ollama.log").read_text()
        assert "instruction park" in log, log
        # The wake: B goes; a request at ollama's front wakes it, and Ollama loads the model.
        stop_proc(runs.pop())
        wait_for(lambda: d.lease_of("B") is None, 30, "B's lease gone")
        code, ans = http("POST", url + "/api/chat", chat, timeout_s=60)
        assert code == 200 and ans["message"]["content"], ans
        assert d.state_of("ollama") == "active" and held() == 8 * GiB
        kinds = [(e["kind"], e.get("engine")) for e in d.timeline()]
        assert ("resume", "ollama") in kinds or ("wake", "ollama") in kinds, kinds
        assert d.sim_oom() == 0
    finally:
        for p in runs:
            stop_proc(p)
        d.stop()


def test_a_poll_that_oversleeps_its_deadline_says_what_it_saw_not_no_time_left():
    """On a loaded machine the poll's sleep can end past the plugin's deadline; the next poll
    then failed inside its own request ("GET /api/ps: no time left within 1 s", CI) instead
    of saying what the engine still showed. The stall is made here by a callback that blocks
    the loop during the sleep."""
    from berth_plugins._http import Engine

    async def ps(request):
        return web.json_response({"models": [{"name": "qwen3:8b", "model": "qwen3:8b"}]})

    async def scenario():
        app = web.Application()
        app.router.add_get("/api/ps", ps)
        async with serve(app) as url:
            async with Engine(ctx("ollama", engine_url=url, timeout_s=0.5)) as eng:
                polls = []

                async def check() -> bool:
                    polls.append((await eng.call("GET", "/api/ps")).status)
                    if len(polls) == 1:
                        # stalls the loop from inside the sleep that follows
                        asyncio.get_running_loop().call_soon(time.sleep, 0.6)
                    return False
                with pytest.raises(MechanismError, match="still lists qwen3:8b"):
                    await eng.wait_for(check, lambda: "GET /api/ps still lists qwen3:8b", 0.05)
    asyncio.run(scenario())


def test_a_deadline_that_runs_out_inside_a_poll_names_what_the_last_poll_saw(kit, pm):
    """On a loaded machine the park's bound ran out inside a GET of ``/api/ps`` after earlier
    polls had listed the model: the error said only "did not answer within 0.0 s". It names
    the model still listed, as when the bound runs out between two polls."""
    calls, release = [], None

    async def listed_then_slow(request):
        calls.append(1)
        if len(calls) > 2:               # the unload's first poll answers, the next hangs
            await release.wait()         # past the bound: the poll is cut by the deadline
        return web.json_response({"models": [{"name": "qwen3:8b", "model": "qwen3:8b"}]})

    async def unload(request):
        return web.json_response({"done": True, "done_reason": "unload"})

    async def scenario():
        nonlocal release
        release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/ps", listed_then_slow)
        app.router.add_post("/api/generate", unload)
        async with serve(app) as url:
            try:
                with pytest.raises(MechanismError, match="still lists qwen3:8b"):
                    await run_action(pm, "berth_park", ctx("ollama", engine_url=url,
                                                           timeout_s=ceiling(1.0)))
            finally:
                release.set()
        assert len(calls) >= 3
    asyncio.run(scenario())
