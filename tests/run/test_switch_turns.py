"""Issue 16 acceptance, live: turns protect work, not idleness.

Two stub engines of 14 GiB behind ``berth run --park checkpoint`` on one simulated 24 GiB card
(1 GiB reserve), with the default policy (minimum turn 10 s, juggle guard 4 swaps in 120 s; only
the reads are made faster, as in ``berth demo``). A client alternates requests between them back
to back: every request goes to the parked engine, so every one is a switch (park the other,
restore this one). Nobody competes (the holder has nothing in flight and nothing queued when the
other's request arrives), so neither the minimum turn nor the juggle guard may hold a switch.
Since issue 24 an idle holder keeps its card while it has been idle less than a switch back would
cost (rent or buy: its measured restore plus the other's park, about the mechanism's own time
here), so each first byte comes within twice the mechanism's own time (the ski-rental bound:
never worse than twice the best choice in hindsight) plus 8 s: the rent is the switch cost
berthd measured, which on a loaded machine includes seconds of process starts beside the tool's
own time (the old waits were 11-15 s per switch and 57-84 s on the fifth).

The default form makes six switches, all inside one juggle window (so the fifth and sixth are
past the guard's four swaps, and every one is inside the previous engine's minimum turn); the
long form (``BERTH_RELIABILITY=long``) alternates for two minutes, as the issue's acceptance did.
In the default form the stand-in cuda-checkpoint moves 70 GB/s (10x the demo's 7 GB/s, which
the long form keeps): its time is subtracted, so its speed is not what the test checks, and a
faster one keeps the default form short.

The mechanism's time is what bench/switch.py subtracts: the wall time of every call of the
stand-in cuda-checkpoint on both engines during the switch, timed by a shim around the tool.
Seen under llama-swap (the issue): 11-15 s per switch (the 10 s minimum turn held an idle
engine's card) and 57-84 s on the fifth switch in two minutes (the juggle guard).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.berthd import BERTH, Berthd, wait_for
from tests.helpers import ceiling, free_port, sweep

TOOL = str(Path(sys.executable).parent / "berth-sim-cuda-checkpoint")
SHIM = """\
#!/bin/sh
t0=$(date +%s%N)
{tool} "$@"
rc=$?
t1=$(date +%s%N)
echo "$t0 $t1 $rc $*" >> {log}
exit $rc
"""
CONFIG = """\
state_dir = "{tmp}/state"

[driver]
kind = "sim"
sim_dir = "{tmp}/sim"
free_delay = "0.5s"
checkpoint_rate = "{rate}"
host_ram = "64GiB"

[[driver.cards]]
pci = "0000:01:00.0"
name = "gpu0"
total = "24GiB"

[cards.gpu0]
reserve = "1GiB"

[board]
listen = "off"

[policy]
read_interval = "0.25s"
"""
LONG_RUN_S = 120.0                      # the long form: two minutes of switches
SWITCHES = 6                            # the default form: past the guard's 4 swaps
JUGGLE_WINDOW_S = 120.0                 # the default policy's juggle_window
SLACK_S = 8.0



def _chat(port: int, model: str) -> tuple[float, float]:
    """One streamed chat: (wall time sent, wall time of the engine's first event); raises on a
    failure."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"Connection: close\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        t0 = time.time()
        s.sendall(req)
        data = s.recv(65536)
        # the engine's first event (a held stream gets the front's keep-alive comments first)
        while b"data: " not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
        t1 = time.time()
        while b"data: [DONE]" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
    assert data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data, data[:400]
    return t0, t1


def _tool_s(log: Path, t0: float, t1: float) -> tuple[float, set[str]]:
    """Seconds of stand-in cuda-checkpoint calls inside [t0, t1], and their actions."""
    total, what = 0.0, set()
    for line in log.read_text().splitlines() if log.exists() else []:
        a, b, _rc, *args = line.split()
        start, end = int(a) / 1e9, int(b) / 1e9
        if start >= t0 and end <= t1:
            total += end - start
            what.add(args[args.index("--action") + 1] if "--action" in args else args[0])
    return total, what


@pytest.mark.early(15)
@pytest.mark.xdist_group("timing")
@pytest.mark.timeout(LONG_RUN_S + 150)   # two minutes of switches at most, the start, the end
@pytest.mark.parametrize("run_s", [pytest.param(None, id="six-switches"),
                                   pytest.param(LONG_RUN_S, id="two-minutes",
                                                marks=pytest.mark.long)])
def test_back_to_back_switches_wait_for_nothing_but_the_mechanism(tmp_path, run_s):
    rate = 7e9 if run_s else 70e9           # bytes per second
    (tmp_path / "berth.toml").write_text(CONFIG.format(tmp=tmp_path, rate=f"{rate:.0f}"))
    calls = tmp_path / "checkpoint-calls.log"
    shim = tmp_path / "cuda-checkpoint-shim"
    shim.write_text(SHIM.format(tool=TOOL, log=calls))
    shim.chmod(0o755)
    d = Berthd(tmp_path, tmp_path / "berth.toml")
    ports = {"A": free_port(), "B": free_port()}
    runs = []
    try:
        d.start()
        env = {**d.env}
        env.pop("BERTH_SIM_CHECKPOINT_BPS", None)     # the rate is the config's
        for name in ("A", "B"):
            runs.append(subprocess.Popen(
                [BERTH, "run", "--engine", name, "--front", f"127.0.0.1:{ports[name]}",
                 "--size", "14GiB", "--park", "checkpoint", "--checkpoint-path", str(shim), "--",
                 BERTH, "sim", "engine", "--port", "{port}", "--weights", "13GiB",
                 "--load-s", "0.1", "--model", name],
                env=env, stdout=open(tmp_path / f"run-{name}.log", "ab"),
                stderr=subprocess.STDOUT, start_new_session=True))
            wait_for(lambda n=name: (d.lease_of(n) or {}).get("ready")
                     and d.state_of(n) == "active", 60, f"{name} serving")
        wait_for(lambda: d.state_of("A") == "parked", 60, "A parked for B")
        rows = []
        target, start = "A", time.monotonic()

        def more() -> bool:
            if run_s is None:
                return len(rows) < SWITCHES
            return time.monotonic() < start + run_s
        while more():
            wait_for(lambda t=target: d.state_of(t) == "parked"
                     and d.state_of("B" if t == "A" else "A") == "active", 60,
                     f"{target} parked, the other serving")
            t0, t1 = _chat(ports[target], target)
            tool, what = _tool_s(calls, t0, t1)
            assert {"checkpoint", "restore"} <= what, (target, what)   # a real switch
            rows.append((target, round(t1 - t0, 2), round(tool, 2), round(t1 - t0 - tool, 2)))
            target = "B" if target == "A" else "A"
        print("target, first byte s, mechanism s, the rest s:", *rows, sep="\n  ")
        late = [r for r in rows if r[1] > 2 * r[2] + SLACK_S]
        # (target, first byte s, mechanism s, the rest s) per switch
        assert len(rows) >= 5 and not late, rows
        if run_s is None:       # all inside one juggle window, or the guard was never tested
            assert time.monotonic() - start < JUGGLE_WINDOW_S, rows
        assert d.status()["counters"]["drains"] == 0
    finally:
        for p in runs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        d.stop()
        sweep(tmp_path)


REQUESTS = 20                            # issue 34's acceptance: 20 requests, A, B, A, ...
PER_SWITCH_S = 0.15                      # issue 34's target for Berth's own time per switch
# What the test holds it to: a bound that holds with eight busy processes beside the suite on
# two cores (Berth's pipeline then takes 0.3-0.4 s a switch: process starts and wake-ups),
# and that a rent fails by far (it keeps the card idle for the mechanism's own time, seconds).
# The target itself is a speed figure: bench/switch.py measures it (overhead_ms_median).
LOADED_PER_SWITCH_S = 1.0


def _tool_wall_s(log: Path, t0: float, t1: float) -> tuple[float, int]:
    """The stand-in cuda-checkpoint's own wall time inside [t0, t1]: the union of its calls'
    intervals (overlapping calls counted once), and how many restores it made."""
    spans, restores = [], 0
    for line in log.read_text().splitlines() if log.exists() else []:
        a, b, _rc, *args = line.split()
        start, end = int(a) / 1e9, int(b) / 1e9
        if start >= t0 and end <= t1:
            spans.append((start, end))
            restores += "restore" in args
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total, restores


@pytest.mark.early(35)
@pytest.mark.xdist_group("timing")
@pytest.mark.timeout(400)
def test_one_client_alternating_two_engines_pays_only_the_mechanism(tmp_path):
    """Issue 34: one person alternates two models that do not fit together (the everyday use
    of llama-swap), on the default policy. The holder's last answer went to the very client
    now waiting on the other engine, so it yields at once (no rent): the 20 requests take the
    checkpoint tool's own wall time (parks and restores, timed by a shim around the tool,
    overlapping calls counted once) plus Berth's own pipeline per switch (the target 0.15 s;
    held here to a bound a loaded machine keeps, and printed). The first request goes to the
    engine that holds the card (llama-swap starts a model for a request), so 19 switch.
    Seen before the issue: 310 s for 20 requests, of which the tool took 147 s (8.1 s of
    Berth's own per switch, the holder keeping its card for the rent)."""
    rate = 70e9
    (tmp_path / "berth.toml").write_text(CONFIG.format(tmp=tmp_path, rate=f"{rate:.0f}"))
    calls = tmp_path / "checkpoint-calls.log"
    shim = tmp_path / "cuda-checkpoint-shim"
    shim.write_text(SHIM.format(tool=TOOL, log=calls))
    shim.chmod(0o755)
    d = Berthd(tmp_path, tmp_path / "berth.toml")
    ports = {"A": free_port(), "B": free_port()}
    runs = []
    try:
        d.start()
        env = {**d.env}
        env.pop("BERTH_SIM_CHECKPOINT_BPS", None)     # the rate is the config's
        for name in ("A", "B"):
            runs.append(subprocess.Popen(
                [BERTH, "run", "--engine", name, "--front", f"127.0.0.1:{ports[name]}",
                 "--size", "14GiB", "--park", "checkpoint", "--checkpoint-path", str(shim), "--",
                 BERTH, "sim", "engine", "--port", "{port}", "--weights", "13GiB",
                 "--load-s", "0.1", "--model", name],
                env=env, stdout=open(tmp_path / f"run-{name}.log", "ab"),
                stderr=subprocess.STDOUT, start_new_session=True))
            wait_for(lambda n=name: (d.lease_of(n) or {}).get("ready")
                     and d.state_of(n) == "active", 60, f"{name} serving")
        wait_for(lambda: d.state_of("A") == "parked", 60, "A parked for B")
        order = ["B", "A"] * (REQUESTS // 2)
        t_start = time.time()
        firsts = [(target, *_chat(ports[target], target)) for target in order]
        t_end = time.time()
        tool, restores = _tool_wall_s(calls, t_start, t_end)
        switches = REQUESTS - 1
        total = t_end - t_start
        print(f"{REQUESTS} requests in {total:.2f}s; checkpoint tool {tool:.2f}s; Berth's own "
              f"{(total - tool) / switches * 1e3:.0f} ms per switch ({switches} switches; "
              f"target {PER_SWITCH_S * 1e3:.0f} ms; load average {os.getloadavg()[0]:.1f})")
        print("target, sent, first byte:", *[(t, round(a - t_start, 2), round(b - a, 2))
                                             for t, a, b in firsts], sep="\n  ")
        assert restores == switches, (restores, switches)      # every request but one switched
        # The bound scales by the machine's slowness (issue 38: 1.3 s a switch at a load of 17).
        assert total <= tool + ceiling(LOADED_PER_SWITCH_S) * switches, (total, tool, switches)
        assert d.status()["counters"]["drains"] == 0
    finally:
        for p in runs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        d.stop()
        sweep(tmp_path)
