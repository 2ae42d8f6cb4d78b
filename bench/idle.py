"""Idle berthd's CPU per read cycle: one simulated card, one or more leases, nothing happening.

Starts a berthd as the tests do (``tests/berthd.py``: one 24 GiB simulated card, the tests'
policy), starts ``--leases`` ``berth run`` leases of 2 GiB each and waits until every one is
active, lets it settle, then measures berthd's CPU over ``--seconds`` (default 10). At the
tests' read interval (0.1 s) an idle berthd is mostly its read cycle: the figure per cycle is
what each read costs. ``--read-interval 1s`` gives a user's berthd (the default policy).
``--profile FILE`` runs berthd under cProfile and writes its profile there at the end.

    python bench/idle.py [--leases 1] [--read-interval 0.1s] [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SSL_CERT_FILE", os.devnull)      # as tests/conftest.py: no CA bundle

from berth.decide.units import parse_duration  # noqa: E402

from tests.berthd import Berthd, berth_run, sim_config, stop_proc, wait_for  # noqa: E402


def measure(d: Berthd, seconds: float) -> tuple[float, float]:
    """``(CPU-s, wall s)`` berthd used over ``seconds``."""
    t0, c0 = time.monotonic(), _cpu(d.proc.pid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), _cpu(d.proc.pid)
    return c1 - c0, t1 - t0


def _cpu(pid: int) -> float:
    """CPU-s of ``pid`` so far: the scheduler's nanoseconds summed over its threads, where
    psutil's user and system times count whole clock ticks (10 ms: a tenth of an idle
    berthd's ten seconds at a 1 s read interval)."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError):
        c = psutil.Process(pid).cpu_times()
        return c.user + c.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leases", type=int, default=1)
    ap.add_argument("--read-interval", default="0.1s")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to measure (s)")
    ap.add_argument("--profile", help="run berthd under cProfile, its profile written here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="berth-idle-"))
    cfg = sim_config(tmp, [("gpu0", "24GiB")], policy={"read_interval": args.read_interval})
    d = Berthd(tmp, cfg)
    runs = []
    try:
        _start(d, args.profile)
        for i in range(args.leases):
            runs.append(berth_run(d, f"E{i}", "--size", "2GiB"))
        for i in range(args.leases):
            wait_for(lambda i=i: d.state_of(f"E{i}") == "active", 60, f"E{i} active")
        time.sleep(2.0)                                 # let start-up settle
        cpu, wall = measure(d, args.seconds)
        interval = parse_duration(args.read_interval)
        out = {"leases": args.leases, "read_interval_s": interval, "seconds": round(wall, 1),
               "cpu_s_per_s": round(cpu / wall, 5),
               "cpu_ms_per_cycle": round(cpu / (wall / interval) * 1000, 3)}
        print(f"idle berthd, 1 card, {args.leases} lease(s), read every {interval:g} s, "
              f"{out['seconds']} s: {out['cpu_s_per_s']} CPU-s/s, "
              f"{out['cpu_ms_per_cycle']} ms CPU per read cycle")
        if args.json:
            print(json.dumps(out))
        return 0
    finally:
        for r in runs:
            stop_proc(r)
        if args.profile and d.proc is not None:
            d.proc.send_signal(signal.SIGINT)
            d.proc.wait(20)
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _start(d: Berthd, profile: str | None) -> None:
    if not profile:
        d.start()
        return
    import subprocess
    d.proc = subprocess.Popen([sys.executable, "-m", "cProfile", "-o", profile, "-m",
                               "berth.cli", "daemon", "--config", str(d.config)],
                              env=d.env, stdout=open(d.log, "ab"), stderr=subprocess.STDOUT)
    wait_for(d._up, 30, "berthd to answer on its socket")


if __name__ == "__main__":
    sys.exit(main())
