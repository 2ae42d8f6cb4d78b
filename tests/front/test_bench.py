"""The front's benchmark runs end to end (tiny scale) and prints the figures it promises. Its
timings are not checked here: they belong to the machine, not to the code."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ceiling

BENCH = Path(__file__).resolve().parents[2] / "bench" / "front.py"


@functools.cache
def bench_run() -> subprocess.CompletedProcess:
    """One tiny-scale run of the benchmark, shared by the tests below (each run takes seconds)."""
    return subprocess.run([sys.executable, str(BENCH), "--json", "--scale", "0.02"],
                          capture_output=True, text=True, timeout=ceiling(60))


def test_bench_front_prints_its_figures_as_json():
    out = bench_run()
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("added_p50_ms_c1", "rps_ratio_c32", "stream_ratio", "stream_ratio_c1",
                "rps_ratio_c1", "stream_ratio_paced_c32"):
        assert isinstance(figures[key], float), key
    assert figures["rps_ratio_c32"] > 0 and figures["stream_ratio"] > 0
    assert {(r["path"], r["case"], r["concurrency"]) for r in figures["runs"]} == {
        (p, c, n) for p in ("direct", "front") for c in ("json", "sse", "sse_paced")
        for n in (1, 32)}


def test_bench_front_compares_with_nginx_or_says_it_is_absent():
    out = bench_run()
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    keys = ("rps_over_nginx_c32", "added_p50_ms_over_nginx_c1", "stream_over_nginx_c32",
            "rps_over_nginx_c1", "nginx_rps_ratio_c32", "nginx_cpu_us_per_request_c32")
    assert isinstance(figures["front_cpu_us_per_request_c32"], float)
    if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
        for key in keys:
            assert isinstance(figures[key], float), key
        assert {(r["path"], r["case"], r["concurrency"]) for r in figures["nginx_runs"]} == {
            ("nginx", c, n) for c in ("json", "sse", "sse_paced") for n in (1, 32)}
        assert "nginx" in out.stdout.splitlines()[0]
    else:   # the script says so and still measures direct and the front
        assert all(figures[key] is None for key in keys) and figures["nginx_runs"] == []
        assert "nginx not found" in out.stderr
