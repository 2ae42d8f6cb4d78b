"""A real supervisord (the PyPI package) running berthd on a simulated 24 GiB card, stub engines
as programs, and Berth's eventlistener; everything under ``tmp_path``. Waits poll observable
state (supervisord's RPC, berthd's status, the listener's mapping file) with deadlines."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from berth.config import load
from berth.daemon.main import open_driver
from berth_hosts.supervisor.rpc import Endpoint, ProcessInfo, Supervisor, SupervisorError

from tests.berthd import FREE_DELAY, READ_INTERVAL
from tests.helpers import free_port, wait_for  # noqa: F401  (re-exported)

PY = sys.executable
SUPERVISORD = str(Path(PY).parent / "supervisord")
SUPERVISORCTL = str(Path(PY).parent / "supervisorctl")
REPO = Path(__file__).resolve().parents[3]
GiB = 1 << 30
PCI = "0000:01:00.0"



def engine_cmd(port: int, weights: str) -> str:
    return f"{PY} -m berth.cli sim engine --port {port} --weights {weights} --card gpu0"


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


@dataclass
class Prog:
    """A ``[program:x]`` section: ``engine`` is its berth.toml entry (``None``: unmapped) with
    ``size``, ``mode`` and the lease ``priority``."""

    name: str
    command: str
    engine: str | None = None
    size: str = "11GiB"
    mode: str = "observe"
    autostart: bool = True
    priority: int = 0
    autorestart: str = "false"
    startsecs: int = 0


class Stack:
    """supervisord + berthd + programs + the listener, configured in ``root``."""

    def __init__(self, root: Path, progs: list[Prog], listener_cmd: str | None = None,
                 policy: dict | None = None, berthd_env: dict | None = None):
        self.root = root
        #: Variables given to berthd's program alone (supervisord's ``environment=``).
        self.berthd_env = berthd_env or {}
        self.sock = root / "s.sock"
        if len(str(self.sock)) > 100:                # AF_UNIX paths are short
            root = Path(tempfile.mkdtemp(prefix="bsv"))
            self.sock = root / "s.sock"
        self.state = self.root / "state"
        self.sim = self.root / "sim"
        self.toml = self.root / "berth.toml"
        self.conf = self.root / "supervisord.conf"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.bsock = self.state / "berthd.sock"
        self.progs = progs
        self.listener_cmd = (listener_cmd or "{py} -m berth.cli supervisor listen "
                             "--config {config}").format(py=PY, config=self.toml)
        self.policy = {"read_interval": READ_INTERVAL, "release_grace": "3s", "min_turn": "300s",
                       **(policy or {})}
        self.env = {**os.environ, "BERTH_SIM_DIR": str(self.sim),
                    "BERTH_STATE_DIR": str(self.state), "BERTH_SOCKET": str(self.bsock),
                    "BERTH_CONFIG": str(self.toml), "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc: subprocess.Popen | None = None
        self.rpc = Supervisor(Endpoint(f"unix://{self.sock}"), timeout_s=10.0)

    # -- configs ---------------------------------------------------------------------------
    def write(self) -> None:
        lines = [f'state_dir = "{self.state}"', "[driver]", 'kind = "sim"',
                 f'sim_dir = "{self.sim}"', f'free_delay = "{FREE_DELAY}"', "[[driver.cards]]",
                 f'pci = "{PCI}"', 'name = "gpu0"', 'total = "24GiB"',
                 # Engines start with berthd: a measured baseline would swallow their memory.
                 "[cards.gpu0]", 'reserve = "512MiB"', 'baseline = "0"',
                 "[api]", f'socket = "{self.bsock}"', "[board]", 'listen = "off"',
                 "[hosts.supervisor]", f'url = "unix://{self.sock}"', "[policy]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.policy.items()]
        for p in self.progs:
            if p.engine:
                lines += [f"[engines.{json.dumps(p.engine, ensure_ascii=False)}]",
                          f"supervisor = {json.dumps(p.name, ensure_ascii=False)}",
                          f'mode = "{p.mode}"', f'size = "{p.size}"', 'card = "gpu0"',
                          f"priority = {p.priority}"]
        self.toml.write_text("\n".join(lines) + "\n", encoding="utf-8")
        sv = [
            "[unix_http_server]", f"file={self.sock}",
            "[supervisord]", f"logfile={self.logs / 'supervisord.log'}",
            f"pidfile={self.root / 'supervisord.pid'}", f"childlogdir={self.logs}",
            "loglevel=debug", "identifier=berth-test",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "[supervisorctl]", f"serverurl=unix://{self.sock}",
            "[program:berthd]", f"command={PY} -m berth.cli daemon --config {self.toml}",
            "priority=1", "startsecs=0", "stopwaitsecs=5", "redirect_stderr=true",
            f"stdout_logfile={self.logs / 'berthd.log'}",
        ]
        if self.berthd_env:
            sv.append("environment=" + ",".join(f'{k}="{v}"' for k, v in self.berthd_env.items()))
        for p in self.progs:
            sv += [f"[program:{p.name}]", f"command={p.command}", "priority=10",
                   f"autostart={'true' if p.autostart else 'false'}",
                   f"autorestart={p.autorestart}",
                   f"startsecs={p.startsecs}", "stopwaitsecs=5", "redirect_stderr=true",
                   f"stdout_logfile={self.logs / (p.name + '.log')}"]
        sv += ["[eventlistener:berth]", f"command={self.listener_cmd}",
               "events=PROCESS_STATE,TICK_5", "buffer_size=100", "autorestart=true",
               "startsecs=0", "stopwaitsecs=5", f"directory={REPO}",
               f"stderr_logfile={self.logs / 'listener.log'}"]
        self.conf.write_text("\n".join(sv) + "\n", encoding="utf-8")

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, wait_up: bool = True) -> "Stack":
        """Start supervisord; ``wait_up``: return once berthd answers too."""
        self.write()
        open_driver(load(self.toml)).close()     # declare the card before any engine starts
        self.proc = subprocess.Popen([SUPERVISORD, "-n", "-c", str(self.conf)], env=self.env,
                                     stdout=open(self.logs / "supervisord.out", "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        if wait_up:
            wait_for(self._up, 40, "supervisord and berthd to answer")
        return self

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"supervisord exited with {self.proc.returncode}:\n"
                                 f"{(self.logs / 'supervisord.out').read_text()}")
        try:
            return self.rpc.info("berthd").statename == "RUNNING" and bool(self.status())
        except (OSError, SupervisorError, ConnectionError, AssertionError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    # -- looking ---------------------------------------------------------------------------
    def info(self, name: str) -> ProcessInfo:
        return self.rpc.info(name)

    def berth(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([PY, "-m", "berth.cli", *args], env=self.env, capture_output=True,
                           text=True, timeout=30)
        if check and r.returncode != 0:
            raise AssertionError(f"berth {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
        return r

    def ctl(self, *args: str) -> str:
        return subprocess.run([SUPERVISORCTL, "-c", str(self.conf), *args], env=self.env,
                              capture_output=True, text=True, timeout=30).stdout

    def status(self) -> dict:
        """berthd's board (``GET /v1/status``, what ``berth status --json`` prints): asked on
        the socket, as waits poll it many times a second (a ``berth status`` process for each
        poll had made the autostart test the suite's most CPU-hungry, issue 38)."""
        conn = _UnixHTTP(str(self.bsock))
        try:
            conn.request("GET", "/v1/status")
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise AssertionError(f"GET /v1/status answered {r.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def leases(self, engine: str) -> list[dict]:
        return [le for le in self.status()["leases"] if le["engine"] == engine]

    def active(self, engine: str, pid: int | None = None) -> dict | None:
        """The one lease of ``engine`` if it is active (on process ``pid`` when given)."""
        ls = self.leases(engine)
        if len(ls) == 1 and [s["state"] for s in ls[0]["shares"]] == ["active"] \
                and ls[0]["pid"] and (pid is None or ls[0]["pid"] == pid):
            return ls[0]
        return None

    def waiting(self, engine: str) -> dict | None:
        return next((w for w in self.status()["waiting"] if w["engine"] == engine), None)

    def berth_timeline(self, lease_id: str) -> list[dict]:
        """berthd's timeline entries about one lease (``GET /v1/timeline``)."""
        return [e for e in self.berth_timeline_all() if e["lease"] == lease_id]

    def berth_timeline_all(self) -> list[dict]:
        """berthd's timeline entries (``GET /v1/timeline``)."""
        conn = _UnixHTTP(str(self.bsock))
        try:
            conn.request("GET", "/v1/timeline")
            return json.loads(conn.getresponse().read())["entries"]
        finally:
            conn.close()

    def mapping(self) -> dict:
        try:
            return json.loads((self.state / "supervisor-listener.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def oom_events(self) -> int:
        """Simulated OOMs on the card so far (an engine's load, or a restore, that failed)."""
        return sum(c["oom_events"] for c in json.loads((self.sim / "cards.json").read_text())
                   ["cards"])

    def log(self, name: str) -> str:
        p = self.logs / name
        return p.read_text(errors="replace") if p.exists() else ""


@pytest.fixture
def stack_factory(tmp_path):
    stacks: list[Stack] = []

    def make(progs: list[Prog], wait_up: bool = True, **kw) -> Stack:
        s = Stack(tmp_path, progs, **kw).start(wait_up)
        stacks.append(s)
        return s
    yield make
    for s in stacks:
        s.stop()
