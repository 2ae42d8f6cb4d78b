"""Fixtures for the simulation kit: one simulated 24 GiB card in ``tmp_path`` and real engine
processes on loopback. Waits poll observable state (``/health``, the card store) with deadlines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from berth.sim.cards import CardSpec, SimCards
from berth.sim.driver import SimDriver

from tests.helpers import free_port, wait_for  # noqa: F401  (re-exported)

GiB = 1 << 30
MiB = 1 << 20
PCI = "0000:01:00.0"
FREE_DELAY_S = 0.5



def http(method: str, url: str, body: dict | bytes | None = None, timeout_s: float = 10.0
         ) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@dataclass
class Engine:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log.read_text()

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"engine exited with {self.proc.returncode}:\n{self.stderr()}")
        try:
            return http("GET", self.url + "/health", timeout_s=1.0)[0] == 200
        except OSError:
            return False


class SimKit:
    def __init__(self, directory: Path, tmp_path: Path):
        self.dir, self.tmp = directory, tmp_path
        self.store = SimCards(directory)
        self.driver = SimDriver(directory)
        self.engines: list[Engine] = []
        self.env = dict(os.environ, BERTH_SIM_DIR=str(directory), BERTH_SIM_CHECKPOINT_BPS="1e12")

    def start(self, *flags: str, weights: str = "14GiB", ready: bool = True,
              card: str | None = "gpu0", env: dict | None = None) -> Engine:
        port = free_port()
        log = self.tmp / f"engine-{port}.log"
        card_flags = ["--card", card] if card is not None else []
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "berth.cli", "sim", "engine", "--port", str(port),
                 *card_flags, "--weights", weights, *flags],
                env=dict(self.env, **(env or {})), stdout=f, stderr=subprocess.STDOUT)
        eng = Engine(proc, port, log)
        self.engines.append(eng)
        if ready:
            wait_for(eng.healthy, what=f"engine on port {port} to load")
        return eng

    def checkpoint(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "berth.sim.checkpoint", *args],
                              env=dict(self.env, **(env or {})), capture_output=True, text=True,
                              timeout=30)

    def state(self, pid: int) -> str:
        return self.checkpoint("--get-state", "--pid", str(pid)).stdout.strip()

    def close(self) -> None:
        for e in self.engines:
            if e.proc.poll() is None:
                e.proc.send_signal(signal.SIGTERM)
        for e in self.engines:
            try:
                e.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                e.proc.kill()
                e.proc.wait()


@pytest.fixture
def kit(tmp_path, monkeypatch):
    directory = tmp_path / "sim"
    monkeypatch.setenv("BERTH_SIM_DIR", str(directory))
    SimCards.init(directory, [CardSpec.make("gpu0", 24 * GiB, pci=PCI)],
                  free_delay_s=FREE_DELAY_S)
    k = SimKit(directory, tmp_path)
    yield k
    k.close()
