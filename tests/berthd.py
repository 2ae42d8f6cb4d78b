"""Test helpers: a real berthd on simulated cards in a temporary directory, a small synchronous
client for its Unix socket, and ``berth run`` processes. Waits poll observable state with a
deadline; nothing sleeps to synchronise."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import wait_for  # noqa: F401  (re-exported: berthd tests wait through it)

BIN = Path(sys.executable).parent
BERTH = str(BIN / "berth")
GiB = 1 << 30


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30.0):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def api(sock: str | Path, method: str, path: str, body=None, raw: bytes | None = None,
        timeout: float = 30.0) -> tuple[int, dict]:
    conn = UnixHTTPConnection(str(sock), timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read()
        try:
            return r.status, json.loads(text) if text else {}
        except ValueError:
            return r.status, {"raw": text.decode(errors="replace")}
    finally:
        conn.close()


#: The simulated driver's free delay for test berthds: how long a dead process's memory stays
#: counted after a read first sees it gone. Short, because it is not what most tests are about;
#: a test about the delay passes its own (``free_delay=``).
FREE_DELAY_S = 0.1
FREE_DELAY = f"{FREE_DELAY_S:g}s"
#: How often a test berthd reads the driver when nothing happens (policy ``read_interval``):
#: berthd's default, what users run. What tests wait for comes sooner: berthd reads at once after
#: every event, and a watch confirms a free with reads of its own. At 0.2 s the suite's 330
#: berthds read five times as often for nothing (an idle read costs about a millisecond of
#: CPU; bench/idle.py), and the suite passed the same with the default.
READ_INTERVAL = "1s"
#: A test berthd's release grace: it bounds a park, lend or drain that does not free the memory
#: (a failure), and the stand-in cuda-checkpoint's calls, a Python process each, took over 10 s
#: together on a loaded two-core machine.
RELEASE_GRACE = "30s"


def sim_config(tmp: Path, cards: list[tuple[str, str]], *, reserve: str = "1GiB",
               policy: dict | None = None, extra: str = "",
               free_delay: str = FREE_DELAY, checkpoint_rate: str | None = None) -> Path:
    """``tmp/berth.toml`` for a berthd on simulated ``cards`` (``(name, total)``), state and
    sim directories under ``tmp``. The board is off (``[board] listen = "off"``) unless
    ``extra`` has a ``[board]`` table of its own: test berthds never bind the default port.
    ``policy`` entries override the test defaults (no minimum turn, ``READ_INTERVAL``, and a
    30 s release grace: a park's several checkpoint-tool processes take seconds on a loaded
    machine, and a test about the fallback sets its own); ``extra`` is TOML appended at the end,
    tables only. ``checkpoint_rate`` (``[driver]``, e.g. ``"70GB"``): the stand-in
    cuda-checkpoint's speed and berthd's estimate of it together, for a test whose moves are
    not what it tests (default: the product's 7 GB/s)."""
    lines = [f'state_dir = "{tmp / "state"}"', "[driver]", 'kind = "sim"',
             f'sim_dir = "{tmp / "sim"}"', f'free_delay = "{free_delay}"']
    if checkpoint_rate is not None:
        lines.append(f'checkpoint_rate = "{checkpoint_rate}"')
    for i, (name, total) in enumerate(cards):
        lines += ["[[driver.cards]]", f'pci = "0000:{i + 1:02x}:00.0"', f'name = "{name}"',
                  f'total = "{total}"']
    for name, _ in cards:
        lines += [f"[cards.{name}]", f'reserve = "{reserve}"']
    if "[board]" not in extra:
        lines += ["[board]", 'listen = "off"']
    pol = {"min_turn": "0s", "juggle_window": "0s", "release_grace": RELEASE_GRACE,
           "read_interval": READ_INTERVAL, **(policy or {})}
    lines.append("[policy]")
    for k, v in pol.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path = tmp / "berth.toml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class Berthd:
    """A berthd process. ``env`` is what clients (berth run, berth status) need."""

    def __init__(self, tmp: Path, config: Path):
        self.tmp = tmp
        self.config = config
        self.sock = tmp / "state" / "berthd.sock"
        self.env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"),
                    "BERTH_SOCKET": str(self.sock), "BERTH_SIM_DIR": str(tmp / "sim"),
                    "BERTH_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}
        self.log = tmp / "berthd.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Berthd":
        if self.sock.exists():
            self.sock.unlink()
        self.proc = subprocess.Popen([BERTH, "daemon", "--config", str(self.config)],
                                     env=self.env, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT)
        wait_for(self._up, 20, "berthd to answer on its socket")
        return self

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"berthd exited with {self.proc.returncode}:\n"
                                 f"{self.log.read_text()}")
        try:
            return api(self.sock, "GET", "/v1/health", timeout=2)[0] == 200
        except OSError:
            return False

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def call(self, method: str, path: str, body=None, **kw) -> tuple[int, dict]:
        return api(self.sock, method, path, body, **kw)

    def status(self) -> dict:
        code, st = self.call("GET", "/v1/status")
        assert code == 200, st
        return st

    def lease_of(self, engine: str) -> dict | None:
        for le in self.status()["leases"]:
            if le["engine"] == engine:
                return le
        return None

    def state_of(self, engine: str) -> str | None:
        le = self.lease_of(engine)
        return "/".join(sh["state"] for sh in le["shares"]) if le else None

    def sim_oom(self) -> int:
        from berth.sim.cards import SimCards
        return sum(c.oom_events for c in SimCards(self.tmp / "sim").snapshot().cards)

    def timeline(self) -> list[dict]:
        return self.call("GET", "/v1/timeline")[1]["entries"]


def berth_run(d: Berthd, engine: str, *args: str, weights: str = "1GiB", load_s: float = 0.1,
              extra_engine: tuple[str, ...] = (), log: Path | None = None) -> subprocess.Popen:
    """Start ``berth run --engine ENGINE ARGS -- berth sim engine --port {port} ...``."""
    log = log or d.tmp / f"run-{engine}.log"
    cmd = [BERTH, "run", "--engine", engine, *args, "--",
           BERTH, "sim", "engine", "--port", "{port}", "--weights", weights,
           "--load-s", str(load_s), *extra_engine]
    return subprocess.Popen(cmd, env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_proc(p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 15) -> int:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.wait(5)
