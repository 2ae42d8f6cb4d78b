"""Fixtures for the broker tests: holder processes (stowaways, or an engine's load driven by
the test), ended at the end, pass or fail; ``berth run`` lines with stub engines and chats
through their fronts. The ``berthd`` and ``runs`` fixtures are the suite's (tests/fixtures.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.berthd import FREE_DELAY_S, Berthd
from tests.helpers import free_port, stop_all  # noqa: F401  (re-exported)

HOLDER = str(Path(__file__).with_name("holder.py"))
PCI = "0000:01:00.0"
GiB = 1 << 30


class Holder:
    """A live process holding simulated memory on command (see ``holder.py``)."""

    def __init__(self, sim_dir: Path):
        self.p = subprocess.Popen([sys.executable, HOLDER, str(sim_dir)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        words = self.p.stdout.readline().split()
        assert words and words[0] == "ready", f"holder did not start: {words}"
        self.pid = int(words[1])

    def _say(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def alloc(self, nbytes: int, pci: str = PCI) -> bool:
        """True when the allocation fit, False on a simulated OOM."""
        return self._say(f"alloc {pci} {nbytes}") == "ok"

    def free(self) -> None:
        assert self._say("free") == "ok"

    def exit(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.write("exit\n")
            self.p.stdin.flush()
            self.p.wait(10)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)


@pytest.fixture
def holders(tmp_path):
    made: list[Holder] = []

    def make() -> Holder:
        h = Holder(tmp_path / "sim")
        made.append(h)
        return h
    yield make
    stop_all([h.p for h in made], tmp_path)


def declare_sim(tmp: Path, cards=(("gpu0", 24 * GiB),)) -> None:
    """Declare the simulated cards before berthd starts (as berthd itself would), so a stowaway
    can be on the card when berthd first reads it."""
    from berth.sim.cards import CardSpec, SimCards
    specs = [CardSpec.make(n, t, pci=f"0000:{i + 1:02x}:00.0") for i, (n, t) in enumerate(cards)]
    SimCards.init(tmp / "sim", specs, free_delay_s=FREE_DELAY_S)


# -- berth run lines and chats ---------------------------------------------------------------------
import http.client as _http
import json as _json

from tests.berthd import BERTH, BIN

CHECKPOINT = str(BIN / "berth-sim-cuda-checkpoint")



def engine_run(d: Berthd, runs: list, engine: str, *, size: str = "14GiB",
               weights: str = "13GiB", front: int | None = None, park: bool = False,
               priority: int | None = None, tokens_per_s: float = 500.0,
               run_args: tuple[str, ...] = (),
               engine_args: tuple[str, ...] = ()) -> subprocess.Popen:
    """``berth run --engine ENGINE --size SIZE [--front 127.0.0.1:PORT] [--park checkpoint]
    -- berth sim engine ...``; its log is ``run-ENGINE.log`` in the test's directory."""
    cmd = [BERTH, "run", "--engine", engine, "--size", size]
    if front is not None:
        cmd += ["--front", f"127.0.0.1:{front}"]
    if park:
        cmd += ["--park", "checkpoint", "--checkpoint-path", CHECKPOINT]
    if priority is not None:
        cmd += ["--priority", str(priority)]
    cmd += [*run_args, "--", BERTH, "sim", "engine", "--port", "{port}", "--weights", weights,
            "--load-s", "0.1", "--model", engine, "--tokens-per-s", str(tokens_per_s), *engine_args]
    p = subprocess.Popen(cmd, env=d.env, stdout=open(d.tmp / f"run-{engine}.log", "ab"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    runs.append(p)
    return p


def token_hold(d: Berthd) -> tuple[Path, tuple[str, ...]]:
    """A hold file in the test's directory (created) and the stub engine's flags that hold
    every request after its first token while it exists (``--token-hold``): a job in flight
    lasts until the test has seen what it waits to see (then removes the file), not for a
    length chosen to outlast a loaded machine."""
    hold = d.tmp / "token-hold"
    hold.touch()
    return hold, ("--token-hold", str(hold))


def run_log(d: Berthd, engine: str) -> str:
    return (d.tmp / f"run-{engine}.log").read_text(errors="replace")


def serving(d: Berthd, engine: str) -> dict | None:
    le = d.lease_of(engine)
    return le if le and le["ready"] and all(s["state"] == "active" for s in le["shares"]) else None


class Chat:
    """One chat completion to a front, streamed or not: ``status``, ``body`` (the JSON of a
    non-streamed answer or an error), ``tokens`` (content chunks of a stream), ``finish``
    (its finish_reason), ``first_s``/``total_s`` (seconds from the send), ``first_at`` (the
    first token's ``time.monotonic()``, the clock of berthd's timeline ``at``)."""

    def __init__(self, port: int, *, max_tokens: int = 4, stream: bool = False,
                 headers: dict | None = None, timeout_s: float = 60.0):
        self.port, self.max_tokens, self.stream = port, max_tokens, stream
        self.headers, self.timeout_s = headers or {}, timeout_s
        self.status: int | None = None
        self.body: dict = {}
        self.tokens = 0
        self.finish: str | None = None
        self.first_s: float | None = None
        self.first_at: float | None = None
        self.total_s: float | None = None
        self.error: str | None = None

    def __call__(self) -> "Chat":
        t0 = time.monotonic()
        conn = _http.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            body = _json.dumps({"model": "m", "max_tokens": self.max_tokens, "stream": self.stream,
                                "messages": [{"role": "user", "content": "hello"}]})
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json", **self.headers})
            r = conn.getresponse()
            self.status = r.status
            if r.status != 200 or not self.stream:
                raw = r.read()
                self.body = _json.loads(raw) if raw else {}
                return self
            while True:
                line = r.readline()
                if not line:
                    break
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                obj = _json.loads(line[6:])
                if "error" in obj:
                    self.error = obj["error"].get("message")
                    continue
                for ch in obj.get("choices", []):
                    if ch.get("delta", {}).get("content"):
                        self.tokens += 1
                        if self.first_s is None:
                            self.first_at = time.monotonic()
                            self.first_s = self.first_at - t0
                    if ch.get("finish_reason"):
                        self.finish = ch["finish_reason"]
        except (OSError, _http.HTTPException) as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.total_s = time.monotonic() - t0
            conn.close()
        return self


def in_thread(fn):
    import threading
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t
