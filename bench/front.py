"""What the front costs: direct to an engine, through nginx, and through :class:`berth.front.Front`.

Separate processes, so that no two share an event loop: a minimal aiohttp upstream (the "engine"),
nginx in front of it (Debian's package, started here with its own config in a temporary directory:
one worker, ``proxy_buffering off``, a keep-alive upstream pool), the front pointed at it (open),
and this process, an aiohttp client that generates the load. Each case runs direct, through nginx
and through the front, at concurrency 1 and 32, all in one run and in up to twelve rounds whose
order rotates, so that the machine's other load falls on every path alike and the ratios compare
like with like. Without nginx on the PATH the script says so and measures the other two:

- ``json``: ``POST /v1/completions`` with a small JSON body, answered with a ~300-byte JSON body;
- ``sse``: ``POST /v1/chat/completions`` answered with a 256-chunk server-sent-event stream, one
  HTTP chunk per event, written as fast as the upstream can (the worst case for a proxy);
- ``sse_paced``: 64 chunks, one every 5 ms (200 tokens/s per stream, faster than an engine
  generates for each of 32 concurrent streams).

Prints p50 and p99 latency (whole response, ms), requests/s, chunks/s, the CPU time each process
spent per request (µs; psutil, 10 ms resolution; nginx's is its worker's), the ratios to direct
and the ratios to nginx. Targets (issue 17, on two cores): the front's requests/s at concurrency 32
≥ 0.7 × nginx's on small JSON, added p50 at concurrency 1 ≤ 0.25 ms over nginx, SSE chunks/s at
concurrency 32 ≥ 0.9 × nginx's. The processes share the machine's cores (``os.cpu_count()`` is
printed): through a proxy a request costs client + proxy + engine CPU where direct it costs client
+ engine, so on two cores the concurrency-32 ratios measure the proxy's CPU cost more than its
latency.

    python bench/front.py [--json] [--scale X] [--only CASE] [--profile FILE]

``--scale`` multiplies the request counts (default 1: about 1.5 min on two shared cores). ``--only`` runs
one case and prints its runs as JSON lines. ``--profile`` writes the front process's cProfile
stats to FILE. With ``--json`` the last line is one JSON object with keys ``added_p50_ms_c1``,
``rps_ratio_c1``, ``rps_ratio_c32``, ``stream_ratio`` (``sse`` chunks/s ratio at concurrency 32),
``stream_ratio_c1``, ``stream_ratio_paced_c32``, ``added_p50_ms_sse_c1``,
``front_cpu_us_per_request_c32``, ``engine_cpu_us_per_request_c32``, ``cpus``, the raw figures
under ``runs`` (direct and front) and ``nginx_runs``, and the comparisons with nginx:
``rps_over_nginx_c32``, ``added_p50_ms_over_nginx_c1``, ``stream_over_nginx_c32``,
``rps_over_nginx_c1``, ``nginx_rps_ratio_c32`` (nginx / direct), ``nginx_cpu_us_per_request_c32``
(null when nginx is absent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import psutil
from nginx import start_nginx  # bench/nginx.py, shared with bench/gateway.py

SSE_CHUNKS = 256
# "sse_paced": PACED_CHUNKS chunks, one per PACE_MS (200 tokens/s per stream: faster than an engine
# generates for each of 32 concurrent streams)
PACE_MS, PACED_CHUNKS = 5.0, 64
CASES = ("json", "sse", "sse_paced")
CONCURRENCY = (1, 32)
# requests per run at scale 1, by (case, concurrency)
COUNTS = {("json", 1): 3000, ("json", 32): 8000, ("sse", 1): 150, ("sse", 32): 768,
          ("sse_paced", 1): 3, ("sse_paced", 32): 64}
WARMUP = {"json": 300, "sse": 20, "sse_paced": 0}
# Each path's requests go in up to ROUNDS rounds of rotating order (see load()), a round of at
# least ROUND_LOAD x the concurrency where the count allows (else at least the concurrency, in up
# to 3): on two shared cores the machine's other load changes within seconds, and short rounds
# spread it over every path alike (with 3 rounds of ~5 s, nginx / direct ranged 0.9..1.6).
ROUNDS, ROUND_LOAD = 12, 4

_REPLY = json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "bench",
    "choices": [{"index": 0, "text": "the quick brown fox jumps over the lazy dog",
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}).encode()
_EVENT = b"data: " + json.dumps({
    "id": "chat-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench",
    "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}]}
).encode() + b"\n\n"
_REQUEST = json.dumps({"model": "bench", "prompt": "the quick brown fox", "max_tokens": 9}).encode()


# ---- the upstream and the front, each in its own process ----------------------------------------

def serve_upstream(port: int) -> None:
    from aiohttp import web

    chunk = _EVENT

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=_REPLY, content_type="application/json")

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        pace_s = float(request.query.get("pace_ms", 0)) / 1e3
        n = int(request.query.get("n", SSE_CHUNKS))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(n):
            await resp.write(chunk)
            if pace_s:
                await asyncio.sleep(pace_s)
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def serve_front(port: int, upstream: str, profile: str | None) -> None:
    from berth.front import Front

    async def main() -> None:
        front = Front("127.0.0.1", port, name="bench", wait_limit_s=10.0)
        await front.start()
        front.set_upstream(upstream)
        front.open()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await front.stop()

    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(main())
        finally:
            prof.disable()
            prof.dump_stats(profile)
    else:
        asyncio.run(main())


# ---- the load generator --------------------------------------------------------------------------

def free_port() -> int:
    """A free port below the ephemeral range (:func:`berth.sim.ports.free_ports`): a
    bind(0) port could be an outgoing connection's by the time its server binds it."""
    from berth.sim.ports import free_ports
    return free_ports()


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    import urllib.error
    import urllib.request
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} not ready after {timeout_s}s")
        time.sleep(0.05)


async def one(session: aiohttp.ClientSession, url: str, case: str) -> int:
    """One request; returns the SSE chunks received (0 for JSON)."""
    if case == "json":
        async with session.post(url + "/v1/completions", data=_REQUEST,
                                headers={"Content-Type": "application/json"}) as r:
            body = await r.read()
            assert r.status == 200 and body == _REPLY, (r.status, body[:200])
            return 0
    path, n = "/v1/chat/completions", SSE_CHUNKS
    if case == "sse_paced":
        path, n = f"{path}?pace_ms={PACE_MS}&n={PACED_CHUNKS}", PACED_CHUNKS
    async with session.post(url + path, data=_REQUEST,
                            headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, r.status
        # pieces as they arrive; a proxy may split an event between two (the engine's socket
        # was full), so the events are counted, and checked byte for byte, on the whole
        pieces = [data async for data in r.content.iter_any()]
    body = b"".join(pieces)
    assert body == _EVENT * n, (len(body), len(_EVENT) * n)
    return n


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of ``proc`` and its children (nginx's master forks its worker)."""
    total = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


async def load(paths: list[tuple[str, str, dict[str, psutil.Process]]], case: str,
               concurrency: int, count: int, warmup: int) -> list[dict]:
    """Run ``count`` requests on each of ``paths`` (name, base URL, processes whose CPU to
    count), after ``warmup`` requests, in up to :data:`ROUNDS` rounds whose order rotates
    (direct, nginx, front, then nginx, front, direct, ...), so that a change in the machine's
    other load falls on every path alike. A round has at least :data:`ROUND_LOAD` x
    ``concurrency`` requests where ``count`` allows, else at least ``concurrency``."""
    rounds = max(1, min(ROUNDS, max(count // (ROUND_LOAD * concurrency),
                                    min(3, count // concurrency))))
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                for name, _, _ in paths}
    got: dict[str, dict] = {name: {"lat": [], "chunks": 0, "wall": 0.0,
                                   "cpu": dict.fromkeys(watch, 0.0)} for name, _, watch in paths}
    try:
        for name, url, _ in paths:   # warm each path's connections once
            session = sessions[name]
            await asyncio.gather(*(one(session, url, case) for _ in range(min(warmup, 32))))
            for _ in range(warmup // 32):
                await one(session, url, case)
        per_round = [count // rounds + (1 if r < count % rounds else 0) for r in range(rounds)]
        for r, n in enumerate(per_round):
            k = r % len(paths)
            for name, url, watch in paths[k:] + paths[:k]:
                if n:
                    await _round(sessions[name], url, case, concurrency, n, watch, got[name])
    finally:
        for session in sessions.values():
            await session.close()
    out = []
    for name, _, _ in paths:
        g = got[name]
        lat = sorted(g["lat"])
        out.append({"path": name, "case": case, "concurrency": concurrency,
                    "requests": len(lat), "p50_ms": statistics.median(lat) * 1e3,
                    "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
                    "rps": len(lat) / g["wall"], "chunks_per_s": g["chunks"] / g["wall"],
                    "cpu_us_per_request": {k: v / len(lat) * 1e6 for k, v in g["cpu"].items()}})
    return out


async def _round(session: aiohttp.ClientSession, url: str, case: str, concurrency: int,
                 count: int, watch: dict[str, psutil.Process], got: dict) -> None:
    lat: list[float] = got["lat"]
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            n = await one(session, url, case)   # not `chunks += await`: workers interleave
            lat.append(time.perf_counter() - t)
            got["chunks"] += n

    cpu0 = {k: cpu_s(p) for k, p in watch.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    got["wall"] += time.perf_counter() - t0
    for k, p in watch.items():
        got["cpu"][k] += cpu_s(p) - cpu0[k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the front process into FILE")
    ap.add_argument("--only", choices=CASES, help="run one case (no ratios printed)")
    ap.add_argument("--role", choices=("upstream", "front"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "upstream":
        return serve_upstream(args.port)
    if args.role == "front":
        return serve_front(args.port, args.upstream, args.profile)

    up_port, front_port, nginx_port = free_port(), free_port(), free_port()
    direct, through = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{front_port}"
    via_nginx = f"http://127.0.0.1:{nginx_port}"
    procs = [spawn("--role", "upstream", "--port", str(up_port))]
    tmp = tempfile.TemporaryDirectory(prefix="berth-bench-nginx-")
    nginx: subprocess.Popen | None = None
    try:
        wait_ready(direct, procs[0])
        front_args = ["--role", "front", "--port", str(front_port), "--upstream", direct]
        if args.profile:
            front_args += ["--profile", args.profile]
        procs.append(spawn(*front_args))
        wait_ready(through, procs[1])
        nginx = start_nginx(nginx_port, up_port, tmp.name)
        if nginx is None:
            print("nginx not found (Debian: apt-get install nginx): measuring direct and the "
                  "front only", file=sys.stderr)
        else:
            procs.append(nginx)
            wait_ready(via_nginx, nginx)
        runs, nginx_runs = [], []
        me, upstream, front = (psutil.Process(), psutil.Process(procs[0].pid),
                               psutil.Process(procs[1].pid))
        paths = [("direct", direct, {"client": me, "engine": upstream})]
        if nginx is not None:
            paths.append(("nginx", via_nginx, {"client": me, "engine": upstream,
                                               "nginx": psutil.Process(nginx.pid)}))
        paths.append(("front", through, {"client": me, "engine": upstream, "front": front}))
        for case in (args.only,) if args.only else CASES:
            for c in CONCURRENCY:
                n = max(c, int(COUNTS[(case, c)] * args.scale))
                warmup = int(WARMUP[case] * min(1.0, args.scale * 5))
                for r in asyncio.run(load(paths, case, c, n, warmup)):
                    (nginx_runs if r["path"] == "nginx" else runs).append(r)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM if p is not nginx else signal.SIGQUIT)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()

    if args.only:
        for r in runs + nginx_runs:
            print(json.dumps(r))
        return

    def get(path: str, case: str, c: int) -> dict:
        return next(r for r in runs + nginx_runs
                    if (r["path"], r["case"], r["concurrency"]) == (path, case, c))

    print(f"front benchmark on {os.cpu_count()} CPUs (direct, nginx, the front)")
    print(f"{'case':<9} {'conc':>4} {'path':<7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>9} "
          f"{'chunks/s':>10}   CPU µs per request: client engine proxy")
    for case in (args.only,) if args.only else CASES:
        for c in CONCURRENCY:
            for path in ("direct", "nginx", "front"):
                if path == "nginx" and nginx is None:
                    continue
                r = get(path, case, c)
                cpu = r["cpu_us_per_request"]
                proxy = cpu.get("front", cpu.get("nginx", 0))
                print(f"{case:<9} {c:>4} {path:<7} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
                      f"{r['rps']:>9.0f} {r['chunks_per_s']:>10.0f}   "
                      f"{cpu['client']:>6.0f} {cpu['engine']:>6.0f} {proxy:>5.0f}")
    figures: dict[str, float | int | None] = {
        "added_p50_ms_c1": get("front", "json", 1)["p50_ms"] - get("direct", "json", 1)["p50_ms"],
        "rps_ratio_c1": get("front", "json", 1)["rps"] / get("direct", "json", 1)["rps"],
        "rps_ratio_c32": get("front", "json", 32)["rps"] / get("direct", "json", 32)["rps"],
        "stream_ratio": get("front", "sse", 32)["chunks_per_s"]
        / get("direct", "sse", 32)["chunks_per_s"],
        "stream_ratio_c1": get("front", "sse", 1)["chunks_per_s"]
        / get("direct", "sse", 1)["chunks_per_s"],
        "stream_ratio_paced_c32": get("front", "sse_paced", 32)["chunks_per_s"]
        / get("direct", "sse_paced", 32)["chunks_per_s"],
        "added_p50_ms_sse_c1": get("front", "sse", 1)["p50_ms"] - get("direct", "sse", 1)["p50_ms"],
        "front_cpu_us_per_request_c32": get("front", "json", 32)["cpu_us_per_request"]["front"],
        "engine_cpu_us_per_request_c32": get("front", "json", 32)["cpu_us_per_request"]["engine"],
        "rps_over_nginx_c32": None, "added_p50_ms_over_nginx_c1": None,
        "stream_over_nginx_c32": None, "rps_over_nginx_c1": None, "nginx_rps_ratio_c32": None,
        "nginx_cpu_us_per_request_c32": None,
    }
    if nginx is not None:
        figures.update({
            "rps_over_nginx_c32": get("front", "json", 32)["rps"] / get("nginx", "json", 32)["rps"],
            "added_p50_ms_over_nginx_c1": get("front", "json", 1)["p50_ms"]
            - get("nginx", "json", 1)["p50_ms"],
            "stream_over_nginx_c32": get("front", "sse", 32)["chunks_per_s"]
            / get("nginx", "sse", 32)["chunks_per_s"],
            "rps_over_nginx_c1": get("front", "json", 1)["rps"] / get("nginx", "json", 1)["rps"],
            "nginx_rps_ratio_c32": get("nginx", "json", 32)["rps"]
            / get("direct", "json", 32)["rps"],
            "nginx_cpu_us_per_request_c32":
                get("nginx", "json", 32)["cpu_us_per_request"]["nginx"],
        })
    figures["cpus"] = os.cpu_count()
    targets = {"added_p50_ms_c1": ("<=", 1.0), "rps_ratio_c32": (">=", 0.7),
               "stream_ratio": (">=", 0.9), "rps_over_nginx_c32": (">=", 0.7),
               "added_p50_ms_over_nginx_c1": ("<=", 0.25), "stream_over_nginx_c32": (">=", 0.9)}
    for k, v in figures.items():
        if k == "cpus":
            continue
        if v is None:
            print(f"{k:<30} {'n/a':>8}   (no nginx)")
            continue
        mark = ""
        if k in targets:
            op, goal = targets[k]
            ok = v <= goal if op == "<=" else v >= goal
            mark = f"   target {op} {goal}: {'met' if ok else 'MISSED'}"
        print(f"{k:<30} {v:8.3f}{mark}")
    if args.json:
        print(json.dumps({**figures, "runs": runs, "nginx_runs": nginx_runs}))


if __name__ == "__main__":
    main()
