"""Machines on loopback for the gateway tests: each one a berthd on its own simulated card and
state directory, its engines under ``berth run --front``, and a ``berth gateway``. Every process
is a real one; waits poll a condition with a deadline."""

from __future__ import annotations

import http.client as httpc
import json
import subprocess
from pathlib import Path

from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc, wait_for
from tests.helpers import free_port  # noqa: F401  (re-exported)

KEY = "k" * 32


async def serve(app) -> tuple:
    """Start aiohttp ``app`` on a free loopback port: ``(runner, port)``."""
    from aiohttp import web
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]



def http(port: int, method: str, path: str, body=None, headers=None, timeout: float = 30.0,
         raw: bytes | None = None) -> tuple[int, dict, dict]:
    """One call on loopback -> (status, JSON body or {"raw": text}, headers)."""
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        text = r.read()
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {"raw": text.decode(errors="replace")}
        return r.status, doc, dict(r.getheaders())
    finally:
        conn.close()


def chat(port: int, model: str, stream: bool = False, **kw):
    return http(port, "POST", "/v1/chat/completions",
                {"model": model, "stream": stream, "max_tokens": 4,
                 "messages": [{"role": "user", "content": "hi"}]}, **kw)


class Machine:
    """One machine: ``berthd``, ``runs`` (engine -> process), ``gw`` (the gateway process) and
    ``port`` (the gateway's)."""

    def __init__(self, tmp: Path, name: str, card: str = "24GiB", peers: list[int] = (),
                 port: int | None = None, extra: str = ""):
        self.tmp = tmp / name
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = port or free_port()
        net = ""
        if peers:
            net = (f'\n[network]\nname = "{name}"\nkey = "{KEY}"\npeer_timeout = "1s"\n'
                   f'peer_retry = "2s"\npeer_poll = "0.3s"\n'
                   f"peers = {json.dumps([f'127.0.0.1:{p}' for p in peers])}\n")
        else:
            net = f'\n[network]\nname = "{name}"\n'
        self.config = sim_config(self.tmp, [("gpu0", card)], reserve="512MiB",
                                 extra=extra + net)
        self.d = Berthd(self.tmp, self.config).start()
        self.runs: dict[str, subprocess.Popen] = {}
        self.fronts: dict[str, int] = {}
        self.gw: subprocess.Popen | None = None

    def run(self, engine: str, *args: str, weights: str = "1GiB", park: bool = False,
            aliases: tuple[str, ...] = (), load_s: float = 0.1, front: int | None = None) -> int:
        front = front or free_port()
        extra = ["--park", "hook", "--adapter", "protocol"] if park else []
        for a in aliases:
            extra += ["--alias", a]
        self.runs[engine] = berth_run(self.d, engine, "--front", f"127.0.0.1:{front}",
                                      "--size", "4GiB", *extra, *args, weights=weights,
                                      load_s=load_s,
                                      extra_engine=("--model", engine,
                                                    *(("--protocol",) if park else ())))
        self.fronts[engine] = front
        return front

    def serving(self, engine: str) -> bool:
        wait_for(lambda: self.d.state_of(engine) == "active", 30, f"{engine} active")
        le = self.d.lease_of(engine)
        wait_for(lambda: self.d.lease_of(engine).get("ready"), 30, f"{engine} ready")
        return le is not None

    def gateway(self, *args: str) -> "Machine":
        log = open(self.tmp / "gateway.log", "ab")
        self.gw = subprocess.Popen([BERTH, "gateway", "--listen", f"127.0.0.1:{self.port}",
                                    "--config", str(self.config), *args],
                                   env={**self.d.env, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                   stderr=subprocess.STDOUT)
        wait_for(self._gw_up, 20, f"gateway {self.name} to answer")
        return self

    def _gw_up(self) -> bool:
        if self.gw.poll() is not None:
            raise AssertionError(f"gateway {self.name} exited {self.gw.returncode}:\n"
                                 + (self.tmp / "gateway.log").read_text())
        try:
            return http(self.port, "GET", "/berth/v1/gateway", timeout=2)[0] == 200
        except OSError:
            return False

    def models(self) -> dict:
        code, doc, _ = http(self.port, "GET", "/v1/models")
        assert code == 200, doc
        return {e["id"]: e for e in doc["data"]} | {"_machines": doc["machines"]}

    def stop(self) -> None:
        procs = [p for p in [self.gw, *self.runs.values()] if p is not None]
        for p in procs:
            stop_proc(p)
        self.d.stop()
