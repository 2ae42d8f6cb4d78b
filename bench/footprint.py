"""Idle berthd's footprint: RSS and CPU over a quiet minute, with 8 simulated cards.

Starts ``berth daemon`` on 8 simulated 24 GiB cards in a temporary directory with the default
read interval (1 s), lets it settle, then measures its resident memory and the CPU it uses over
``--seconds`` (default 60). Targets (issue 4): RSS ≤ 80 MiB, CPU ≤ 1% of one core.

    python bench/footprint.py [--seconds 60] [--json]

With ``--json`` the last line is one JSON object with keys ``rss_mib`` and ``cpu_percent``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def config(tmp: Path, cards: int) -> str:
    lines = [f'state_dir = "{tmp}/state"', "[driver]", 'kind = "sim"', f'sim_dir = "{tmp}/sim"']
    for i in range(cards):
        lines += ["[[driver.cards]]", f'pci = "0000:{i + 1:02x}:00.0"', f'name = "gpu{i}"',
                  'total = "24GiB"']
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to measure (s)")
    ap.add_argument("--cards", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="berth-footprint-"))
    (tmp / "berth.toml").write_text(config(tmp, args.cards))
    env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"),
           "BERTH_SOCKET": str(tmp / "state" / "berthd.sock")}
    berth = str(Path(sys.executable).parent / "berth")
    proc = subprocess.Popen([berth, "daemon", "--config", str(tmp / "berth.toml")], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "berthd.log", "wb"))
    try:
        sock = tmp / "state" / "berthd.sock"
        end = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > end:
                print((tmp / "berthd.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.1)
        p = psutil.Process(proc.pid)
        time.sleep(3.0)                            # let start-up settle before measuring
        t0, c0 = time.monotonic(), p.cpu_times()
        rss_peak = p.memory_info().rss
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            rss_peak = max(rss_peak, p.memory_info().rss)
        t1, c1 = time.monotonic(), p.cpu_times()
        cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100
        out = {"rss_mib": round(rss_peak / 2**20, 1), "cpu_percent": round(cpu, 3),
               "cards": args.cards, "seconds": round(t1 - t0, 1),
               "targets": {"rss_mib": 80, "cpu_percent": 1.0}}
        print(f"idle berthd, {args.cards} simulated cards, {out['seconds']} s: "
              f"RSS {out['rss_mib']} MiB (target ≤ 80: ratio {out['rss_mib'] / 80:.2f}), "
              f"CPU {out['cpu_percent']}% of one core (target ≤ 1%: ratio "
              f"{out['cpu_percent'] / 1.0:.2f})")
        if args.json:
            print(json.dumps(out))
        return 0
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
