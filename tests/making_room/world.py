"""The live acceptance of issue 6 (lends, parks per share, fallbacks): a real berthd on simulated
cards, real ``berth run`` processes with their fronts, stub engines, and clients over sockets.

Every wait polls observable state (the board, the timeline, the simulated cards, a process's
exit) with a deadline; nothing sleeps to synchronise. Every process a test started is killed at
the end, pass or fail: the runs' process groups first, then a sweep of every process whose
environment names the test's state directory (engines, watchdogs, checkpoint tools).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from tests.berthd import BERTH, BIN, Berthd, GiB, api, sim_config
from tests.helpers import free_port, stop_all, stop_group, wait_for  # noqa: F401  (re-exported)

CHECKPOINT = str(BIN / "berth-sim-cuda-checkpoint")
MiB = 1 << 20



def chat(port: int, *, max_tokens: int = 4, timeout_s: float = 30.0) -> tuple[int, dict]:
    """A non-streamed chat completion to the front on ``port``: (HTTP status, JSON body)."""
    body = json.dumps({"model": "stub", "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def served(port: int) -> dict:
    """A chat that must succeed with generated tokens; returns its body."""
    status, body = chat(port)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] > 0, body
    return body


class Run:
    """One ``berth run`` process (its own session, so its group can be killed)."""

    def __init__(self, live: "Live", engine: str, run_args: list[str], engine_args: list[str],
                 env: dict[str, str] | None = None, front: bool = True):
        self.engine = engine
        self.front = free_port() if front else None
        self.log = live.tmp / f"run-{engine}.log"
        argv = [BERTH, "run", "--engine", engine]
        if self.front:
            argv += ["--front", f"127.0.0.1:{self.front}"]
        argv += [*run_args, "--", BERTH, "sim", "engine", "--port", "{port}", "--load-s", "0.1",
                 "--model", engine, *engine_args]
        self.proc = subprocess.Popen(argv, env={**live.d.env, **(env or {})},
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as a host stops it; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def exited(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        stop_group(self.proc)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Live:
    """A berthd on simulated cards in ``tmp`` and the runs of one test."""

    def __init__(self, tmp: Path, cards: list[tuple[str, str]], policy: dict):
        self.tmp = tmp
        self.d = Berthd(tmp, sim_config(tmp, cards, policy=policy))
        self.runs: list[Run] = []

    def start(self) -> "Live":
        self.d.start()
        return self

    def run(self, engine: str, run_args: list[str], engine_args: list[str], **kw) -> Run:
        r = Run(self, engine, run_args, engine_args, **kw)
        self.runs.append(r)
        return r

    # -- what the board, the timeline and the cards say ----------------------------------------
    def lease(self, engine: str) -> dict | None:
        return self.d.lease_of(engine)

    def states(self, engine: str) -> dict[str, str]:
        """{card name: share state} of the engine's lease ({} when it has none)."""
        le = self.lease(engine)
        return {sh["card_name"]: sh["state"] for sh in le["shares"]} if le else {}

    def serving(self, engine: str) -> dict | None:
        """The lease once every share is active and the engine answered (else None)."""
        le = self.lease(engine)
        if le and le["ready"] and le["pid"] and all(s["state"] == "active" for s in le["shares"]):
            return le
        return None

    def wait_serving(self, engine: str, timeout: float = 60.0) -> dict:
        return wait_for(lambda: self.serving(engine), timeout, f"{engine} granted and serving")

    def counters(self) -> dict:
        return self.d.status()["counters"]

    def timeline(self) -> list[dict]:
        return self.d.timeline()

    def entry(self, engine: str, kind: str, after: int = 0) -> dict:
        """The first timeline entry of ``kind`` for ``engine`` with a seq above ``after``."""
        for e in self.timeline():
            if e["engine"] == engine and e["kind"] == kind and e["seq"] > after:
                return e
        raise AssertionError(f"no {kind!r} entry for {engine} after seq {after}: "
                             + "; ".join(f"{e['seq']} {e['engine']} {e['kind']}"
                                         for e in self.timeline()))

    def card_use(self, name: str) -> dict[int, int]:
        """{pid: bytes} the simulated card ``name`` holds now (a driver read)."""
        from berth.sim.cards import SimCards
        for c in SimCards(self.tmp / "sim").snapshot().cards:
            if c.spec.name == name:
                return dict(c.processes)
        raise KeyError(name)

    def oom_events(self) -> int:
        return self.d.sim_oom()

    def operator(self, op: str, target: str) -> tuple[int, dict]:
        return api(self.d.sock, "POST", f"/v1/operator/{op}", {"target": target})

    def close(self) -> None:
        stop_all([*(r.proc for r in self.runs), self.d.proc], self.tmp)


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


__all__ = ["CHECKPOINT", "GiB", "MiB", "Live", "Run", "chat", "served", "free_port", "gone"]
