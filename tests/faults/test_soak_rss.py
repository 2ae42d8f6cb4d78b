"""``bench/soak.py``'s ``fronts_rss_growth_mib`` (issue 26, Low): a front's RSS is sampled from
when its run says its engine serves, not from the run's start, so a new run's import ramp is
not counted as growth. Real processes stand in for berthd and a run; their logs are written by
the test."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("berth_bench_soak", SOAK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_front_is_sampled_only_once_its_run_serves(tmp_path):
    soak = _soak_module().Soak(tmp_path, clients=1, deadline_s=1.0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    soak.berthd = subprocess.Popen(sleeper)
    log = tmp_path / "run-A.log"
    log.write_bytes(b"an earlier run of A: A is serving on http://127.0.0.1:1\n")
    at = log.stat().st_size
    run = subprocess.Popen(sleeper)
    try:
        soak.runs["A"] = (run, 1)
        soak.log_at[run.pid] = at            # as start_run records it
        soak.sample_rss()
        assert run.pid not in soak.rss, "sampled while its run still starts"
        assert soak.berthd.pid in soak.rss
        with open(log, "ab") as f:
            f.write(b"2026 berth run[A] INFO: A is serving on http://127.0.0.1:2\n")
        soak.sample_rss()
        assert run.pid in soak.rss
    finally:
        for p in (run, soak.berthd):
            p.kill()
            p.wait(5)
