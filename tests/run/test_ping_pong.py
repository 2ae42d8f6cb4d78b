"""Issue 24, live: two busy clients, one per engine, on one card (the ping-pong).

Two 14 GiB stub engines behind ``berth run --park checkpoint`` on one simulated 24 GiB card
(1 GiB reserve, host RAM for both parks, the stand-in cuda-checkpoint at the seed's 7 GB/s),
berthd's default policy (only the reads made faster, as in ``berth demo``). One client per
engine sends a chat, waits for its answer, pauses 1 s, and sends again, for 90 s. Before the
issue every pause made the holder "idle", it yielded at once, and every request paid a full park
and restore: 13 answered in 90 s. Rent-or-buy keeps an idle holder's card while its client
comes back within the switch's cost, and a turn is bounded by ``max_turn``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from tests.berthd import BERTH, Berthd, wait_for
from tests.helpers import sweep
from tests.run.world import CHECKPOINT, free_port

CONFIG = """\
state_dir = "{tmp}/state"

[driver]
kind = "sim"
sim_dir = "{tmp}/sim"
free_delay = "0.5s"
checkpoint_rate = "7000000000"
host_ram = "64GiB"

[[driver.cards]]
pci = "0000:01:00.0"
name = "gpu0"
total = "24GiB"

[cards.gpu0]
reserve = "1GiB"

[policy]
read_interval = "0.25s"
"""
RUN_S = 90.0
PAUSE_S = 1.0


def _chat(port: int, model: str) -> int:
    """One chat; its HTTP status (the body is read whole)."""
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello"}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=150)
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def _client(port: int, model: str, end: float, out: list) -> None:
    """Chat, pause, chat again until ``end`` (monotonic); ``out`` gets (sent, answered, status)."""
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            status = _chat(port, model)
        except OSError as e:
            status = f"{type(e).__name__}: {e}"
        out.append((t0, time.monotonic(), status))
        time.sleep(PAUSE_S)          # the client's own pause: the workload, not synchronisation


@pytest.mark.timeout(RUN_S + 240)
def test_two_busy_clients_are_served_in_turns_not_one_switch_per_request(tmp_path):
    (tmp_path / "berth.toml").write_text(CONFIG.format(tmp=tmp_path))
    d = Berthd(tmp_path, tmp_path / "berth.toml")
    ports = {"A": free_port(), "B": free_port()}
    runs = []
    try:
        d.start()
        env = {**d.env}
        env.pop("BERTH_SIM_CHECKPOINT_BPS", None)      # the rate is the config's
        for name in ("A", "B"):
            runs.append(subprocess.Popen(
                [BERTH, "run", "--engine", name, "--front", f"127.0.0.1:{ports[name]}",
                 "--size", "14GiB", "--park", "checkpoint", "--checkpoint-path", CHECKPOINT, "--",
                 BERTH, "sim", "engine", "--port", "{port}", "--weights", "13GiB",
                 "--load-s", "0.1", "--model", name],
                env=env, stdout=open(tmp_path / f"run-{name}.log", "ab"),
                stderr=subprocess.STDOUT, start_new_session=True))
            wait_for(lambda n=name: (d.lease_of(n) or {}).get("ready")
                     and d.state_of(n) == "active", 60, f"{name} serving")
        wait_for(lambda: d.state_of("A") == "parked", 60, "A parked for B")
        before = d.status()["counters"]
        rows: dict[str, list] = {"A": [], "B": []}
        end = time.monotonic() + RUN_S
        threads = [threading.Thread(target=_client, args=(ports[n], n, end, rows[n]))
                   for n in ("A", "B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_S + 160)
        after = d.status()["counters"]
        answered = {n: [r for r in rows[n] if r[1] <= end] for n in rows}
        bad = [(n, r) for n in rows for r in rows[n] if r[2] != 200]
        switches = after["checkpoints"] - before["checkpoints"]
        load = os.getloadavg()
        t0 = min(r[0] for n in rows for r in rows[n])
        for n in rows:
            print(n, " ".join(f"{r[0] - t0:.1f}+{r[1] - r[0]:.1f}" for r in rows[n]))
        print(f"answered in {RUN_S:g}s: A {len(answered['A'])}, B {len(answered['B'])}; "
              f"checkpoints {switches}, wakes {after['wakes'] - before['wakes']}; "
              f"load average {load[0]:.1f}")
        assert not bad, bad
        assert d.sim_oom() == 0
        total = len(answered["A"]) + len(answered["B"])
        assert total >= 45 and min(len(a) for a in answered.values()) >= 10, answered
    finally:
        for p in runs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        d.stop()
        sweep(tmp_path)
