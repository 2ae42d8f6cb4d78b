"""The gateway's benchmark runs end to end (tiny scale) and prints the figures it promises, nginx
beside it when nginx is installed. Its timings are not checked here: they belong to the machine,
not to the code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"
CASES = {("json", 1), ("json", 32), ("sse", 32)}


def test_bench_gateway_prints_its_figures_as_json_beside_nginx():
    out = subprocess.run([sys.executable, str(BENCH), "--json", "--scale", "0.02"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("added_p50_ms_c1", "rps_ratio_c1", "rps_ratio_c32", "stream_ratio",
                "gateway_cpu_us_per_request_c32", "load_1m"):
        assert isinstance(figures[key], float), key
    assert figures["rps_ratio_c32"] > 0 and figures["stream_ratio"] > 0
    nginx = shutil.which("nginx") or Path("/usr/sbin/nginx").exists()
    keys = ("rps_over_nginx_c32", "added_p50_ms_over_nginx_c1", "stream_over_nginx_c32")
    paths = {"direct", "front", "gateway"} | ({"nginx"} if nginx else set())
    assert {(r["path"], r["case"], r["concurrency"]) for r in figures["runs"]} == {
        (p, c, n) for p in paths for c, n in CASES}
    if nginx:
        assert all(isinstance(figures[k], float) and figures[k] > -100 for k in keys), figures
    else:
        assert all(figures[k] is None for k in keys) and "nginx not found" in out.stderr
