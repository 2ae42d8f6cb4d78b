"""What the gateway costs: direct to an engine against through ``berth gateway``.

Separate processes, so that no two share an event loop: a minimal aiohttp upstream (the
"engine"), ``berth gateway`` with a berth.toml whose ``[engines.bench]`` names the upstream's url
(no berthd: the gateway fails open and routes by berth.toml, so the figures are the gateway's own
cost, without a front), and this process, an aiohttp client that generates the load. Each case
runs direct and through the gateway, in rounds whose order rotates so that the machine's other
load falls on both paths alike:

- ``json``: ``POST /v1/completions`` with a small JSON body naming ``model``, answered with a
  ~300-byte JSON body, at concurrency 1 and 32;
- ``sse``: ``POST /v1/chat/completions`` answered with a 256-chunk server-sent-event stream, at
  concurrency 32.

    python bench/gateway.py [--json] [--scale X]

Prints p50 latency (whole response, ms), requests/s and chunks/s per path, and the ratios.
With ``--json`` the last line is one JSON object with keys ``added_p50_ms_c1`` (gateway p50 minus
direct p50 at concurrency 1), ``rps_ratio_c1``, ``rps_ratio_c32`` (gateway / direct requests/s),
``stream_ratio`` (SSE chunks/s at concurrency 32), ``cpus`` and the raw figures under ``runs``,
the same way ``bench/front.py`` does. ``--scale`` multiplies the request counts (default 1: about
15 s on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

SSE_CHUNKS = 256
COUNTS = {("json", 1): 2000, ("json", 32): 6000, ("sse", 32): 320}
ROUNDS = 3
_REQUEST = json.dumps({"model": "bench", "prompt": "the quick brown fox", "max_tokens": 9}).encode()
_CHAT = json.dumps({"model": "bench", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}).encode()


def serve_upstream(port: int) -> None:
    from aiohttp import web
    reply = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1,
                        "model": "bench", "choices": [{"index": 0, "text": "the quick brown fox "
                                                       "jumps over the lazy dog",
                                                       "finish_reason": "stop"}]}).encode()
    chunk = b"data: " + json.dumps({"object": "chat.completion.chunk", "model": "bench",
                                    "choices": [{"index": 0, "delta": {"content": "tok"}}]}
                                   ).encode() + b"\n\n"

    async def completions(request):
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    async def chat(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(SSE_CHUNKS):
            await resp.write(chunk)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    import urllib.request
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not answer within {timeout_s} s")


async def one(session: aiohttp.ClientSession, url: str, case: str) -> int:
    path, body = ("/v1/completions", _REQUEST) if case == "json" else ("/v1/chat/completions",
                                                                       _CHAT)
    async with session.post(url + path, data=body,
                            headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise SystemExit(f"{url}{path}: HTTP {r.status}: {(await r.text())[:300]}")
        if case == "json":
            await r.read()
            return 0
        return (await r.read()).count(b"\n\n")     # events (one per chunk the engine wrote)


async def run(session: aiohttp.ClientSession, url: str, case: str, concurrency: int,
              n: int) -> dict:
    lat: list[float] = []
    chunks = 0
    left = n

    async def worker():
        nonlocal left, chunks
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            got = await one(session, url, case)     # (not `chunks += await ...`: the read of
            chunks += got                           # chunks would predate the await)
            lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"n": len(lat), "wall_s": wall, "lat": lat, "chunks": chunks}


async def bench(paths: dict[str, str], scale: float) -> list[dict]:
    out: list[dict] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for (case, conc), count in COUNTS.items():
            n = max(conc, int(count * scale / ROUNDS))
            for url in paths.values():                       # warm up both
                await run(s, url, case, conc, min(n, 50))
            acc = {p: {"n": 0, "wall_s": 0.0, "lat": [], "chunks": 0} for p in paths}
            order = list(paths)
            for rnd in range(ROUNDS):
                for p in order[rnd % 2:] + order[:rnd % 2]:
                    r = await run(s, paths[p], case, conc, n)
                    a = acc[p]
                    a["n"] += r["n"]
                    a["wall_s"] += r["wall_s"]
                    a["lat"] += r["lat"]
                    a["chunks"] += r["chunks"]
            for p, a in acc.items():
                out.append({"path": p, "case": case, "concurrency": conc,
                            "p50_ms": statistics.median(a["lat"]) * 1000,
                            "p99_ms": sorted(a["lat"])[int(0.99 * (len(a["lat"]) - 1))] * 1000,
                            "rps": a["n"] / a["wall_s"],
                            "chunks_per_s": a["chunks"] / a["wall_s"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the request counts")
    args = ap.parse_args()
    if args.scale <= 0:
        raise SystemExit("--scale: must be more than 0")
    up_port, gw_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="berth-bench-gw-") as tmp:
        cfg = Path(tmp) / "berth.toml"
        cfg.write_text(f'state_dir = "{tmp}"\n[engines.bench]\nurl = "http://127.0.0.1:{up_port}"'
                       f'\n[network]\nname = "bench"\n')
        env = {**os.environ, "BERTH_STATE_DIR": tmp, "BERTH_SOCKET": f"{tmp}/none.sock"}
        try:
            procs.append(subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)]))
            wait_ready(f"http://127.0.0.1:{up_port}/health", procs[-1])
            berth = str(Path(sys.executable).parent / "berth")
            procs.append(subprocess.Popen([berth, "gateway", "--listen", f"127.0.0.1:{gw_port}",
                                           "--config", str(cfg)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_ready(f"http://127.0.0.1:{gw_port}/berth/v1/gateway", procs[-1])
            runs = asyncio.run(bench({"direct": f"http://127.0.0.1:{up_port}",
                                      "gateway": f"http://127.0.0.1:{gw_port}"}, args.scale))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)

    def get(path, case, conc):
        return next(r for r in runs if (r["path"], r["case"], r["concurrency"]) == (path, case,
                                                                                     conc))
    for r in runs:
        print(f"{r['path']:8} {r['case']:5} c={r['concurrency']:<3} p50 {r['p50_ms']:7.3f} ms  "
              f"p99 {r['p99_ms']:7.3f} ms  {r['rps']:8.0f} req/s  {r['chunks_per_s']:9.0f} chunks/s")
    fig = {"added_p50_ms_c1": get("gateway", "json", 1)["p50_ms"] - get("direct", "json", 1)["p50_ms"],
           "rps_ratio_c1": get("gateway", "json", 1)["rps"] / get("direct", "json", 1)["rps"],
           "rps_ratio_c32": get("gateway", "json", 32)["rps"] / get("direct", "json", 32)["rps"],
           "stream_ratio": get("gateway", "sse", 32)["chunks_per_s"]
           / get("direct", "sse", 32)["chunks_per_s"],
           "cpus": os.cpu_count(), "runs": runs}
    print(f"gateway: added p50 {fig['added_p50_ms_c1']:.3f} ms at c=1; requests/s ratio "
          f"{fig['rps_ratio_c1']:.2f} at c=1, {fig['rps_ratio_c32']:.2f} at c=32; SSE chunks/s "
          f"ratio {fig['stream_ratio']:.2f} at c=32 ({fig['cpus']} CPUs)")
    if args.json:
        print(json.dumps(fig))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--upstream":
        serve_upstream(int(sys.argv[2]))
    else:
        main()
