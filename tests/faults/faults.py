"""Helpers shared by the fault tests and ``bench/soak.py``: a berthd whose stand-in
checkpoint is slow enough to be caught mid-move, runs with fronts, and requests through them
with a deadline (each ends 200 and complete, or 503 with a reason, or is counted as a hang)."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.berthd import BERTH, BIN, FREE_DELAY, READ_INTERVAL, RELEASE_GRACE, Berthd
from tests.helpers import free_port  # noqa: F401  (re-exported)

CHECKPOINT = str(BIN / "berth-sim-cuda-checkpoint")
GiB = 1 << 30


def config(tmp: Path, *, total: str = "24GiB", checkpoint_rate: str = "6GB",
           free_delay: str = FREE_DELAY, policy: dict | None = None) -> Path:
    """berth.toml for one simulated card ``gpu0``; ``checkpoint_rate`` per second is the stand-in
    cuda-checkpoint's speed (6 GB/s: a 9 GiB move takes about 1.6 s, long enough to land a fault
    inside it)."""
    pol = {"min_turn": "0s", "juggle_window": "0s", "ram_budget": "64GiB",
           "release_grace": RELEASE_GRACE, "read_interval": READ_INTERVAL, **(policy or {})}
    text = (f'state_dir = "{tmp / "state"}"\n'
            f'[driver]\nkind = "sim"\nsim_dir = "{tmp / "sim"}"\nfree_delay = "{free_delay}"\n'
            f'checkpoint_rate = "{checkpoint_rate}"\n'
            f'[[driver.cards]]\npci = "0000:01:00.0"\nname = "gpu0"\ntotal = "{total}"\n'
            f'[cards.gpu0]\nreserve = "1GiB"\n[board]\nlisten = "off"\n[policy]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in pol.items()))
    path = tmp / "berth.toml"
    path.write_text(text)
    return path



def start_run(d: Berthd, engine: str, *, size: str = "10GiB", weights: str = "9GiB",
              park: bool = True, extra: tuple[str, ...] = (),
              engine_extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """``berth run`` with a front (and checkpoint park); returns (process, front port)."""
    port = free_port()
    argv = [BERTH, "run", "--engine", engine, "--front", f"127.0.0.1:{port}", "--size", size]
    if park:
        argv += ["--park", "checkpoint", "--checkpoint-path", CHECKPOINT]
    argv += [*extra, "--", BERTH, "sim", "engine", "--port", "{port}", "--weights", weights,
             "--load-s", "0.1", "--model", engine, *engine_extra]
    p = subprocess.Popen(argv, env=d.env, stdout=open(d.tmp / f"run-{engine}.log", "ab"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    return p, port


@dataclass
class Outcome:
    """What became of requests: ``ok`` (200 with tokens), ``refused`` (503 by reason),
    ``hangs`` (no answer before the deadline), ``other`` (anything else, by status)."""

    ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    hangs: int = 0
    other: dict[str, int] = field(default_factory=dict)
    holds: list[float] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return self.ok + sum(self.refused.values()) + self.hangs + sum(self.other.values())

    def add(self, o: "Outcome") -> None:
        self.ok += o.ok
        self.hangs += o.hangs
        self.holds += o.holds
        for k, v in o.refused.items():
            self.refused[k] = self.refused.get(k, 0) + v
        for k, v in o.other.items():
            self.other[k] = self.other.get(k, 0) + v


def _reason(body: dict) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    msg = (err or {}).get("message") if isinstance(err, dict) else None
    return (msg or "").split(":")[0].strip()[:60] or "(no reason)"


def chat(port: int, model: str, deadline_s: float, out: Outcome) -> None:
    """One chat through a front; its outcome goes to ``out``."""
    import time
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=deadline_s) as r:
            data = json.loads(r.read())
            if r.status == 200 and data.get("usage", {}).get("completion_tokens", 0) > 0:
                out.ok += 1
            else:
                out.other[str(r.status)] = out.other.get(str(r.status), 0) + 1
    except urllib.error.HTTPError as e:
        try:
            data = json.loads(e.read() or b"{}")
        except ValueError:
            data = {}
        if e.code == 503 and _reason(data) != "(no reason)":
            out.refused[_reason(data)] = out.refused.get(_reason(data), 0) + 1
        else:
            out.other[str(e.code)] = out.other.get(str(e.code), 0) + 1
    except (TimeoutError, socket.timeout):
        out.hangs += 1
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        why = getattr(e, "reason", e)
        if isinstance(why, (TimeoutError, socket.timeout)):
            out.hangs += 1
        else:
            out.other["connect"] = out.other.get("connect", 0) + 1
    out.holds.append(time.monotonic() - t0)
