"""Fixtures for the ComfyUI host: a real berthd on a simulated 24 GiB card, the ComfyUI stand-in
(``berth sim comfyui``) with the node folder copied alone into its ``custom_nodes``, loaded from
the file path at startup as ComfyUI does, and model files on disk (sparse: their size is what
counts). Waits poll observable state with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import struct
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import berth_hosts.comfyui
import pytest

from tests.berthd import BERTH, Berthd, GiB, sim_config, stop_proc, wait_for
from tests.helpers import free_port  # noqa: F401  (re-exported)

NODE_DIR = Path(berth_hosts.comfyui.__file__).parent

ENTRY = """
[engines.comfyui]
size = "20GiB"
growth_allowance = "1GiB"
"""



def http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return r.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else {}


def prompt(*models: tuple[str, str, str], steps: int = 2) -> dict:
    """A ComfyUI API-format prompt: one loader node per ``(class_type, input, file)``, a
    sampler of ``steps`` steps, and Berth's status node."""
    p = {str(i + 1): {"class_type": c, "inputs": {inp: f}} for i, (c, inp, f) in enumerate(models)}
    p[str(len(p) + 1)] = {"class_type": "KSampler", "inputs": {"steps": steps}}
    p[str(len(p) + 1)] = {"class_type": "BerthStatus", "inputs": {}}
    return {"prompt": p}


@dataclass
class Comfy:
    """A running ComfyUI stand-in with the node."""

    proc: subprocess.Popen
    url: str
    log: Path
    posted: list = field(default_factory=list)

    def get(self, path: str) -> tuple[int, dict]:
        return http("GET", self.url + path)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        return http("POST", self.url + path, body)

    def post_in_thread(self, path: str, body: dict) -> dict:
        """POST from a thread; the returned dict gets ``status``/``body`` when it answers."""
        out: dict = {}

        def go():
            out["status"], out["body"] = self.post(path, body)
        t = threading.Thread(target=go, daemon=True)
        t.start()
        out["thread"] = t
        return out

    def berth(self) -> dict:
        code, st = self.get("/berth/v1/state")
        assert code == 200, st
        return st["berth"]

    def history(self, prompt_id: str) -> dict | None:
        return self.get(f"/history/{prompt_id}")[1].get(prompt_id)

    def done(self, prompt_id: str) -> dict | None:
        h = self.history(prompt_id)
        return h["status"] if h else None


class Page:
    """ComfyUI's websocket as its page holds it (``/ws?clientId=ID``), read in a thread: the
    progress texts (binary event 3: node id, text) and the JSON messages it got."""

    def __init__(self, url: str, client_id: str):
        self.url, self.client_id = url, client_id
        self.texts: list[tuple[str, str]] = []
        self.messages: list[dict] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ws = None
        self._open = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._read()), daemon=True)
        self._thread.start()
        assert self._open.wait(10), "the websocket did not open"

    async def _read(self) -> None:
        import aiohttp
        self._loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as s, \
                s.ws_connect(f"{self.url}/ws?clientId={self.client_id}") as ws:
            self._ws = ws
            self._open.set()
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    event, = struct.unpack(">I", msg.data[:4])
                    if event == 3:
                        n, = struct.unpack(">I", msg.data[4:8])
                        self.texts.append((msg.data[8:8 + n].decode(),
                                           msg.data[8 + n:].decode()))
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    self.messages.append(json.loads(msg.data))

    def close(self) -> None:
        if self._loop is not None and self._ws is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._ws.close(), self._loop).result(5)
        self._thread.join(5)


class World:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.d: Berthd | None = None
        self.procs: list[subprocess.Popen] = []
        self.env: dict = {}
        models = tmp / "models"
        for folder, name, size in (("checkpoints", "sd15.safetensors", 2 * GiB),
                                   ("diffusion_models", "flux-dev.safetensors", 10 * GiB),
                                   ("vae", "ae.safetensors", 300 << 20)):
            (models / folder).mkdir(parents=True, exist_ok=True)
            with open(models / folder / name, "wb") as f:
                f.truncate(size)
        self.models = models
        nodes = tmp / "custom_nodes"
        nodes.mkdir()
        # The folder alone, as a user copies it (it must import only `berth` and itself).
        shutil.copytree(NODE_DIR, nodes / "berth-comfyui",
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.node = nodes / "berth-comfyui"

    def berthd(self, policy: dict | None = None, entry: str = ENTRY,
               checkpoint_rate: str | None = None) -> Berthd:
        cfg = sim_config(self.tmp, [("gpu0", "24GiB")], policy=policy, extra=entry,
                         checkpoint_rate=checkpoint_rate)
        self.d = Berthd(self.tmp, cfg).start()
        self.env = self.d.env
        return self.d

    def no_berthd(self) -> None:
        """Cards declared, berthd never started: the socket does not exist."""
        from berth.sim.cards import CardSpec, SimCards
        SimCards.init(self.tmp / "sim", [CardSpec.make("gpu0", 24 * GiB, pci="0000:01:00.0")])
        import os
        self.env = {**os.environ, "BERTH_STATE_DIR": str(self.tmp / "state"),
                    "BERTH_SOCKET": str(self.tmp / "state" / "berthd.sock"),
                    "BERTH_SIM_DIR": str(self.tmp / "sim"),
                    "BERTH_CONFIG": str(self.tmp / "berth.toml"), "PYTHONUNBUFFERED": "1"}

    def comfyui(self, *flags: str, step_s: float = 0.05, env: dict | None = None) -> Comfy:
        port = free_port()
        log = self.tmp / f"comfyui-{port}.log"
        proc = subprocess.Popen([BERTH, "sim", "comfyui", "--port", str(port), "--models",
                                 str(self.models), "--custom-node", str(self.node),
                                 "--step-s", str(step_s), *flags],
                                env={**self.env, **(env or {})}, stdout=open(log, "ab"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        c = Comfy(proc, f"http://127.0.0.1:{port}", log)

        def up():
            if proc.poll() is not None:
                raise AssertionError(f"the stand-in exited:\n{log.read_text()}")
            try:
                return c.get("/queue")[0] == 200
            except OSError:
                return False
        wait_for(up, 20, "the ComfyUI stand-in to answer")
        return c

    def close(self) -> None:
        for p in reversed(self.procs):
            stop_proc(p)
        if self.d is not None:
            self.d.stop()


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()
