"""The llama.cpp adapter and ``berth sim charge`` against the real ``llama-server`` (issue 30).

Router mode (``--models-dir``): a park unloads the model (its child process ends, and so does its
memory on the simulated card), a wake loads it again in a new child. A single-model server cannot
be asked to sleep: ``/models/unload`` is the router's (404), ``POST /props`` changes nothing, and
``--sleep-idle-seconds`` sleeps it only when its idle timer runs out, so its park fails at once
saying why (the ladder drains it; ``tests/hosts/llama_swap/test_real_swap.py`` shows the drain).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from berth.sim.cards import CardSpec, SimCards

from bench.realswap import wait_until
from berth_plugins.hookspecs import ActionContext, MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

pytestmark = pytest.mark.real

GiB = 1 << 30
CHARGE = str(Path(sys.executable).parent / "berth-sim-charge")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return None, None


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture
def cards(tmp_path):
    """One simulated 4 GiB card in ``tmp_path/sim``."""
    store = SimCards.init(tmp_path / "sim", [CardSpec.make("gpu0", 4 * GiB)], free_delay_s=0.1)
    return store


@pytest.fixture
def server(real_tools, tmp_path, cards):
    """Start a ``llama-server`` (through ``berth-sim-charge``) with the flags given; yields
    ``(url, proc)``; stops it at teardown."""
    procs: list[subprocess.Popen] = []

    def start(*flags: str, charge=("--size", "512MiB")) -> tuple[str, subprocess.Popen]:
        port = _port()
        env = {**os.environ, "BERTH_SIM_DIR": str(tmp_path / "sim"),
               "BERTH_STATE_DIR": str(tmp_path)}
        cmd = [CHARGE, *charge, "--", str(real_tools.llama_server), "--port", str(port),
               "--host", "127.0.0.1", "-c", "256", "-t", "1", *flags]
        with open(tmp_path / f"server-{port}.log", "ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: proc.poll() is None and _get(url + "/health")[0] == 200, 30,
                   "llama-server's /health")
        return url, proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _status(url: str, model: str) -> str:
    _, body = _get(url + "/models")
    return next(e["status"]["value"] for e in body["data"] if e["id"] == model)


def _act(hook: str, url: str, model: str, **kw):
    ctx = ActionContext(engine="tiny", mechanism="llamacpp", engine_url=url,
                        options={"model": model}, timeout_s=60.0, **kw)
    return asyncio.run(run_action(make_plugin_manager(), hook, ctx))


def _children(proc: subprocess.Popen) -> list[int]:
    import psutil
    return [c.pid for c in psutil.Process(proc.pid).children()
            if c.status() != psutil.STATUS_ZOMBIE]


def test_router_park_and_wake_for_real(server, cards, real_tools):
    url, proc = server("--models-dir", str(real_tools.models), "--models-max", "1",
                       charge=("--size", "512MiB", "--per-child", "2GiB"))
    assert _status(url, "tiny-a") == "unloaded"
    code, body = _post(url + "/v1/chat/completions",
                       {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4})
    assert code == 200, body                       # the router autoloads tiny-a in a child
    child = wait_until(lambda: _children(proc), 20, "the model's child")[0]
    wait_until(lambda: cards.read(cards.resolve("gpu0").pci).used_bytes == 2 * GiB + GiB // 2,
               20, "the child's 2 GiB on the card")
    _act("berth_park", url, "tiny-a")
    assert _status(url, "tiny-a") == "unloaded"
    wait_until(lambda: not _children(proc), 20, "the child to end")
    wait_until(lambda: cards.read(cards.resolve("gpu0").pci).used_bytes == GiB // 2, 20,
               "only the router's own 512 MiB left (the residual)")
    _act("berth_wake", url, "tiny-a", room_confirmed=True)
    assert _status(url, "tiny-a") == "loaded"
    new = wait_until(lambda: _children(proc), 20, "a new child")[0]
    assert new != child
    code, body = _post(url + "/v1/chat/completions",
                       {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4})
    assert code == 200 and body["choices"][0]["message"]["content"]


def test_a_single_model_server_cannot_be_asked_to_sleep_so_its_park_fails_saying_why(
        server, real_tools):
    url, _ = server("-m", str(real_tools.models / "tiny-a.gguf"), "--sleep-idle-seconds", "3600")
    # what llama.cpp offers: a sleep that only its idle timer starts
    assert _get(url + "/props")[1]["is_sleeping"] is False
    assert _post(url + "/models/unload", {"model": "tiny-a"})[0] == 404
    assert _post(url + "/props", {"is_sleeping": True})[0] in (200, 501)
    assert _get(url + "/props")[1]["is_sleeping"] is False
    with pytest.raises(MechanismError, match="single-model server has no park.*idle timer"):
        _act("berth_park", url, "tiny-a")
    assert _get(url + "/props")[1]["is_sleeping"] is False
    # and it still serves: a failed park touched nothing
    code, _ = _post(url + "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert code == 200


def test_its_own_idle_timer_does_sleep_it(server, real_tools):
    url, _ = server("-m", str(real_tools.models / "tiny-a.gguf"), "--sleep-idle-seconds", "1")
    wait_until(lambda: _get(url + "/props")[1]["is_sleeping"], 30, "is_sleeping")
    code, _ = _post(url + "/tokenize", {"content": "hi"})      # any task wakes it
    assert code == 200 and _get(url + "/props")[1]["is_sleeping"] is False


@pytest.mark.expect_oom
def test_charge_without_room_is_a_simulated_oom_and_starts_nothing(tmp_path, cards, real_tools):
    r = subprocess.run([CHARGE, "--size", "5GiB", "--", str(real_tools.llama_server),
                        "--version"], env={**os.environ, "BERTH_SIM_DIR": str(tmp_path / "sim")},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "CUDA out of memory" in r.stderr
    assert "version:" not in r.stdout + r.stderr      # llama-server never ran
    assert cards.snapshot().cards[0].oom_events == 1 and cards.snapshot().cards[0].used_bytes == 0
