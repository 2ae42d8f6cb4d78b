"""The gateway's benchmark runs end to end (tiny scale) and prints the figures it promises. Its
timings are not checked here: they belong to the machine, not to the code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"


def test_bench_gateway_prints_its_figures_as_json():
    out = subprocess.run([sys.executable, str(BENCH), "--json", "--scale", "0.02"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("added_p50_ms_c1", "rps_ratio_c1", "rps_ratio_c32", "stream_ratio"):
        assert isinstance(figures[key], float), key
    assert figures["rps_ratio_c32"] > 0 and figures["stream_ratio"] > 0
    assert {(r["path"], r["case"], r["concurrency"]) for r in figures["runs"]} == {
        (p, c, n) for p in ("direct", "gateway") for c, n in (("json", 1), ("json", 32),
                                                               ("sse", 32))}
