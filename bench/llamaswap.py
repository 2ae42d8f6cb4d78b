"""The same two-model switch through the real llama-swap, alone and under Berth.

Source: issue 30 ("A switch no slower than llama-swap's own"); ``../shared/tools`` (the real
llama-swap v250-5-g0bdb37, a CPU ``llama-server``, two tiny GGUFs). Usage::

    python bench/llamaswap.py [--switches N] [--json] [--park-stand-in]

Two models, ``tiny-a`` and ``tiny-b``, each a real ``llama-server`` started through
``berth-sim-charge`` (3 GiB each on a simulated 4 GiB card with a 512 MiB reserve: they cannot
share it). A switch is one chat (8 tokens, not streamed) to the model that is not serving, timed
from the request to the whole answer; the first chat (a cold start) is not counted.

- **alone**: llama-swap on the plain config swaps by itself: it stops one server and starts the
  other (one model at a time, no groups). Its servers start directly, as a user's do today.
- **berth**: the config wrapped by ``berth llama-swap wrap`` with its defaults (here, without
  cuda-checkpoint: models drain to make room), berthd on the simulated card.
- ``--park-stand-in``: also the Berth side with the stand-in cuda-checkpoint found by wrap
  (``BERTH_CUDA_CHECKPOINT=berth-sim-cuda-checkpoint``): parks instead of drains.

``berth_run_start_s_median``: from the exec of ``berth run --front …`` to its front accepting a
connection (median of the same number of runs). ``charge_exec_s_median``: what
``berth-sim-charge`` (the simulation, not Berth) adds to each start on the Berth side: from its
exec to the exec of the command it wraps (``true`` here), counted against Berth's switch. ``errors``: answers that were not 200, both
sides. ``oom_events``: simulated OOMs on the Berth side's card. ``real_engine``: a real
``llama-server`` answered. The last line (``--json``) is one JSON object with those keys,
``alone_switch_s_median``, ``berth_switch_s_median``, ``berth_minus_alone_switch_s`` and the
machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from berth.sim.ports import free_ports  # noqa: E402

from bench.realswap import BIN, Model, Swap, Tools, tools_dir  # noqa: E402


def _models() -> list[Model]:
    return [Model("tiny-a", "tiny-a.gguf"), Model("tiny-b", "tiny-b.gguf")]


def switches(swap: Swap, n: int) -> tuple[list[float], int, bool]:
    """Warm up with ``tiny-a``, then ``n`` switches; returns (seconds each, errors, whether a
    real llama-server answered)."""
    first = swap.chat("tiny-a", timeout=300)
    errors = int(first.status != 200)
    real = first.status == 200 and ".gguf" in first.json().get("model", "")
    times = []
    for i in range(n):
        ans = swap.chat("tiny-b" if i % 2 == 0 else "tiny-a", timeout=300)
        times.append(ans.total_s)
        if ans.status != 200:
            errors += 1
            print(f"  switch {i + 1}: {ans.status} {ans.body[:200]!r}", file=sys.stderr)
    return times, errors, real


def run_start(swap: Swap, n: int) -> list[float]:
    """Seconds from the exec of ``berth run --front`` to its front accepting a connection."""
    out = []
    for _ in range(n):
        port = free_ports()     # below the ephemeral range: no connection holds it meanwhile
        cmd = [str(BIN / "berth"), "run", "--engine", "start-probe", "--front",
               f"127.0.0.1:{port}", "--size", "1MiB", "--", str(swap.tools.llama_server),
               "--port", "{port}", "-m", str(swap.tools.models / "tiny-a.gguf")]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=swap.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    out.append(time.monotonic() - t0)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() - t0 > 60:
                        raise RuntimeError("berth run did not listen") from None
                    time.sleep(0.002)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    return out


def charge_exec(swap: Swap, n: int) -> list[float]:
    """Seconds ``berth-sim-charge --size 1MiB -- true`` takes, start to end."""
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run([str(BIN / "berth-sim-charge"), "--size", "1MiB", "--", "true"],
                       env=swap.env, check=True, timeout=60)
        out.append(time.monotonic() - t0)
    return out


def side(root: Path, tools: Tools, name: str, n: int, *, berth: bool, free_delay: str,
         env: dict | None = None) -> dict:
    saved = dict(os.environ)
    os.environ.update(env or {})
    swap = Swap(root / name, tools, _models(), berth=berth, free_delay=free_delay, charge=berth)
    try:
        swap.start()
        times, errors, real = switches(swap, n)
        out = {"times": times, "errors": errors, "real": real}
        if berth:
            out["oom"] = swap.sim_card()["oom_events"]
            out["start"] = run_start(swap, n)
            out["charge"] = charge_exec(swap, n)
            out["counters"] = (swap.berth_status() or {}).get("counters", {})
        return out
    finally:
        swap.close()
        os.environ.clear()
        os.environ.update(saved)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switches", type=int, default=10, help="switches per side (at least 8)")
    ap.add_argument("--free-delay", default="0s",
                    help="the simulated driver's free delay after an exit (default 0s: the CPU "
                         "engine frees at exit, so only Berth's own confirmation is measured)")
    ap.add_argument("--park-stand-in", action="store_true",
                    help="also measure Berth with the stand-in cuda-checkpoint (parks)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args()
    tools = Tools.find()
    if tools.missing():
        print(f"bench/llamaswap.py: the real programs are missing in {tools_dir()}: "
              f"{', '.join(tools.missing())}", file=sys.stderr)
        return 2
    n = max(8, args.switches)
    with tempfile.TemporaryDirectory(prefix="berth-bench-llamaswap-") as tmp:
        root = Path(tmp)
        alone = side(root, tools, "alone", n, berth=False, free_delay=args.free_delay)
        berth = side(root, tools, "berth", n, berth=True, free_delay=args.free_delay)
        park = None
        if args.park_stand_in:
            park = side(root, tools, "park", n, berth=True, free_delay=args.free_delay,
                        env={"BERTH_CUDA_CHECKPOINT": "berth-sim-cuda-checkpoint",
                             "PATH": f"{BIN}:{os.environ.get('PATH', '')}"})
    a_med, b_med = statistics.median(alone["times"]), statistics.median(berth["times"])
    s_med = statistics.median(berth["start"])
    report = {
        "alone_switch_s_median": round(a_med, 3),
        "berth_switch_s_median": round(b_med, 3),
        "berth_minus_alone_switch_s": round(b_med - a_med, 3),
        "berth_run_start_s_median": round(s_med, 3),
        "charge_exec_s_median": round(statistics.median(berth["charge"]), 3),
        "errors": alone["errors"] + berth["errors"] + (park["errors"] if park else 0),
        "oom_events": berth["oom"] + (park["oom"] if park else 0),
        "real_engine": alone["real"] and berth["real"],
        "switches": n,
        "free_delay": args.free_delay,
        "alone_switch_s": [round(t, 3) for t in alone["times"]],
        "berth_switch_s": [round(t, 3) for t in berth["times"]],
        "berth_drains": berth["counters"].get("drains"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if park:
        report["berth_park_switch_s_median"] = round(statistics.median(park["times"]), 3)
        report["berth_park_switch_s"] = [round(t, 3) for t in park["times"]]
    print(f"alone (llama-swap swaps):   median {a_med:.3f} s over {n} switches")
    print(f"berth (wrap's defaults):    median {b_med:.3f} s ({b_med - a_med:+.3f} s; "
          f"{berth['counters'].get('drains')} drains)")
    if park:
        print(f"berth (stand-in parks):     median {report['berth_park_switch_s_median']:.3f} s")
    print(f"berth run exec -> front:    median {s_med:.3f} s")
    print(f"berth-sim-charge's own exec: median {report['charge_exec_s_median']:.3f} s (the "
          f"simulation's, in each Berth-side start)")
    print(f"errors {report['errors']}, simulated OOM {report['oom_events']}, real engine "
          f"{report['real_engine']}, load average {report['load_average']}")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
