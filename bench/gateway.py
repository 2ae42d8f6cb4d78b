"""What the gateway costs: beside nginx, on the same upstream and the same load, in one run.

Separate processes, so that no two share an event loop: the minimal aiohttp upstream of
``bench/front.py`` (the "engine"), a Berth front before it (``bench/front.py``'s front, open),
``berth gateway`` with a berth.toml whose ``[engines.bench]`` names that front (no berthd: the
gateway fails open and routes by berth.toml), nginx straight to the engine (``bench/nginx.py``,
shared with ``bench/front.py``), and this process, an aiohttp client that generates the load.
A request through the gateway takes two hops (gateway, front) where nginx's takes one: the
figures say what a user of ``berth gateway`` pays over the proxy they would otherwise run.

Each case runs on every path (direct, nginx, front, gateway) in rounds whose order rotates
(``bench/front.py``'s ``load``), so that the machine's other load falls on every path alike:

- ``json``: ``POST /v1/completions`` with a small JSON body naming ``model``, answered with a
  ~300-byte JSON body, at concurrency 1 and 32;
- ``sse``: ``POST /v1/chat/completions`` answered with a 256-chunk server-sent-event stream, at
  concurrency 32.

    python bench/gateway.py [--json] [--scale X]

Prints p50 and p99 latency (whole response, ms), requests/s, chunks/s and CPU µs per request of
each process, and the figures. With ``--json`` the last line is one JSON object with keys
``rps_over_nginx_c32`` (gateway / nginx requests/s at concurrency 32; target ≥ 0.6),
``added_p50_ms_over_nginx_c1`` (gateway p50 minus nginx p50 at concurrency 1; ≤ 0.35),
``stream_over_nginx_c32`` (gateway / nginx SSE chunks/s at concurrency 32; ≥ 0.9), the same
against the engine direct (``added_p50_ms_c1``, ``rps_ratio_c1``, ``rps_ratio_c32``,
``stream_ratio``), ``gateway_cpu_us_per_request_c32``, ``front_cpu_us_per_request_c32``,
``nginx_cpu_us_per_request_c32``, ``cpus``, ``load_1m`` (the machine's load average at the
end) and the raw figures under ``runs``. Without nginx the script says so, and the nginx keys
are null. ``--scale`` multiplies the request counts (default 1: about a minute on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import front as fb  # bench/front.py: its upstream, front, load generator and nginx
import psutil
from nginx import start_nginx

CASES = (("json", 1), ("json", 32), ("sse", 32))
COUNTS = {("json", 1): 3000, ("json", 32): 8000, ("sse", 32): 768}   # as bench/front.py
WARMUP = {"json": 200, "sse": 20}
PATHS = ("direct", "nginx", "front", "gateway")
TARGETS = {"rps_over_nginx_c32": (">=", 0.6), "added_p50_ms_over_nginx_c1": ("<=", 0.35),
           "stream_over_nginx_c32": (">=", 0.9)}


def start_gateway(port: int, front_port: int, tmp: str) -> subprocess.Popen:
    cfg = Path(tmp) / "berth.toml"
    cfg.write_text(f'state_dir = "{tmp}"\n[engines.bench]\nfront = "127.0.0.1:{front_port}"\n'
                   f'[network]\nname = "bench"\n')
    env = {**os.environ, "BERTH_STATE_DIR": tmp, "BERTH_SOCKET": f"{tmp}/none.sock"}
    berth = str(Path(sys.executable).parent / "berth")
    return subprocess.Popen([berth, "gateway", "--listen", f"127.0.0.1:{port}", "--config",
                             str(cfg)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def start_all(tmp: str) -> tuple[dict[str, str], dict[str, subprocess.Popen], bool]:
    """The upstream, the front, the gateway and nginx: their URLs and processes, and whether
    nginx runs."""
    ports = {p: fb.free_port() for p in PATHS}
    urls = {p: f"http://127.0.0.1:{ports[p]}" for p in PATHS}
    procs = {"direct": fb.spawn("--role", "upstream", "--port", str(ports["direct"]))}
    fb.wait_ready(urls["direct"], procs["direct"])
    procs["front"] = fb.spawn("--role", "front", "--port", str(ports["front"]), "--upstream",
                              urls["direct"])
    fb.wait_ready(urls["front"], procs["front"])
    procs["gateway"] = start_gateway(ports["gateway"], ports["front"], tmp)
    _wait_gateway(urls["gateway"], procs["gateway"])
    nginx = start_nginx(ports["nginx"], ports["direct"], tmp)
    if nginx is None:
        print("nginx not found (Debian: apt-get install nginx): measuring without it",
              file=sys.stderr)
    else:
        procs["nginx"] = nginx
        fb.wait_ready(urls["nginx"], nginx)
    return urls, procs, nginx is not None


def _wait_gateway(url: str, proc: subprocess.Popen) -> None:
    import time
    import urllib.request
    end = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit(f"{url} not ready after 30 s")
        time.sleep(0.05)


def measure(urls: dict[str, str], procs: dict[str, subprocess.Popen], scale: float) -> list:
    me = psutil.Process()
    watch = {name: psutil.Process(p.pid) for name, p in procs.items()}
    paths = []
    for name in PATHS:
        if name not in procs:
            continue
        w = {"client": me, "engine": watch["direct"]}
        if name != "direct":
            w[name] = watch[name]
        if name == "gateway":
            w["front"] = watch["front"]
        paths.append((name, urls[name], w))
    runs = []
    for case, c in CASES:
        n = max(c, int(COUNTS[(case, c)] * scale))
        warmup = int(WARMUP[case] * min(1.0, scale * 5))
        runs += asyncio.run(fb.load(paths, case, c, n, warmup))
    return runs


def figures(runs: list, nginx: bool) -> dict:
    def get(path: str, case: str, c: int) -> dict:
        return next(r for r in runs if (r["path"], r["case"], r["concurrency"]) == (path, case, c))

    gw = {k: get("gateway", *k) for k in CASES}
    direct = {k: get("direct", *k) for k in CASES}
    out: dict = {
        "added_p50_ms_c1": gw["json", 1]["p50_ms"] - direct["json", 1]["p50_ms"],
        "rps_ratio_c1": gw["json", 1]["rps"] / direct["json", 1]["rps"],
        "rps_ratio_c32": gw["json", 32]["rps"] / direct["json", 32]["rps"],
        "stream_ratio": gw["sse", 32]["chunks_per_s"] / direct["sse", 32]["chunks_per_s"],
        "gateway_cpu_us_per_request_c32": gw["json", 32]["cpu_us_per_request"]["gateway"],
        "front_cpu_us_per_request_c32": get("front", "json", 32)["cpu_us_per_request"]["front"],
        "rps_over_nginx_c32": None, "added_p50_ms_over_nginx_c1": None,
        "stream_over_nginx_c32": None, "nginx_cpu_us_per_request_c32": None}
    if nginx:
        ng = {k: get("nginx", *k) for k in CASES}
        out.update({
            "rps_over_nginx_c32": gw["json", 32]["rps"] / ng["json", 32]["rps"],
            "added_p50_ms_over_nginx_c1": gw["json", 1]["p50_ms"] - ng["json", 1]["p50_ms"],
            "stream_over_nginx_c32": gw["sse", 32]["chunks_per_s"]
            / ng["sse", 32]["chunks_per_s"],
            "nginx_cpu_us_per_request_c32": ng["json", 32]["cpu_us_per_request"]["nginx"]})
    out["cpus"] = os.cpu_count()
    out["load_1m"] = os.getloadavg()[0]
    return out


def report(runs: list, figs: dict) -> None:
    print(f"gateway benchmark on {figs['cpus']} CPUs (direct, nginx, the front, the gateway "
          f"through the front)")
    print(f"{'case':<5} {'conc':>4} {'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
          f"{'chunks/s':>9}   CPU µs per request by process")
    for r in runs:
        cpu = " ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_request"].items())
        print(f"{r['case']:<5} {r['concurrency']:>4} {r['path']:<8} {r['p50_ms']:>8.3f} "
              f"{r['p99_ms']:>8.3f} {r['rps']:>8.0f} {r['chunks_per_s']:>9.0f}   {cpu}")
    for k, v in figs.items():
        if v is None:
            print(f"{k:<32} {'n/a':>8}   (no nginx)")
            continue
        mark = ""
        if k in TARGETS:
            op, goal = TARGETS[k]
            ok = v <= goal if op == "<=" else v >= goal
            mark = f"   target {op} {goal}: {'met' if ok else 'MISSED'}"
        print(f"{k:<32} {v:8.3f}{mark}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the request counts")
    args = ap.parse_args()
    if args.scale <= 0:
        raise SystemExit("--scale: must be more than 0")
    with tempfile.TemporaryDirectory(prefix="berth-bench-gw-") as tmp:
        procs: dict[str, subprocess.Popen] = {}
        try:
            urls, procs, nginx = start_all(tmp)
            runs = measure(urls, procs, args.scale)
        finally:
            for name, p in procs.items():
                p.send_signal(signal.SIGQUIT if name == "nginx" else signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
    figs = figures(runs, nginx)
    report(runs, figs)
    if args.json:
        print(json.dumps({**figs, "runs": runs}))


if __name__ == "__main__":
    main()
