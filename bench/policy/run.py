"""Replay the workloads through every policy and print the comparison.

    python bench/policy/run.py                       # every workload, every policy, plots
    python bench/policy/run.py --workload a-one-card --policy swap --policy berth-scan-declared
    python bench/policy/run.py --quick               # one workload, its first 10 minutes
    python bench/policy/run.py --json                # last line: {"<workload>/<policy>": {...}}
    python bench/policy/run.py --seed 3              # the workloads gen.py makes from seed 3

Each workload also gets a reference row, ``ideal``: the same trace with every card large enough
for all its engines (see :func:`ideal`). Prints the commit that ran (``git rev-parse --short HEAD``, and whether ``core/`` or
``bench/policy/`` had uncommitted changes), a Markdown table, and writes PNG plots to ``--out``
(default ``bench/policy/out/``, git-ignored); ``--figures DIR`` also copies them there (the
README's figures live in ``bench/policy/figures/``). ``--check`` audits the accounting after
every event (slower).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "bench.policy"

import berth  # noqa: E402

from .gen import WORKLOADS as SEEDED  # noqa: E402
from .metrics import cards_table, table  # noqa: E402
from .policies import DEFAULT, KNOBS, POLICIES, make  # noqa: E402
from .shapes import SHAPES  # noqa: E402
from .verdict import lines, verdict  # noqa: E402
from .workload import Workload  # noqa: E402
from .world import World  # noqa: E402

__all__ = ["main", "run_one", "load_workload", "commit"]

HERE = Path(__file__).resolve().parent
QUICK_WORKLOAD, QUICK_S = "a-one-card", 600.0
#: gen.py's hour-long workloads, then the shapes (issue 24's e-i, issue 34's j onward).
WORKLOADS = (*SEEDED, *SHAPES)


def load_workload(name: str) -> Workload:
    """A committed workload by name, or a path to a workload file."""
    path = Path(name) if name.endswith(".json") else HERE / "workloads" / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"workload {name!r}: no file {path} (known: {', '.join(WORKLOADS)})")
    return Workload.load(path)


def run_one(wl: Workload, policy: str, check: bool = False, knobs: dict | None = None):
    """Replay ``wl`` under ``policy`` (``knobs`` override Berth's); returns the run's
    :class:`~bench.policy.metrics.Recorder`."""
    return World(wl, make(policy, knobs), check=check).run()


def _knob(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if name not in KNOBS or not value:
        raise argparse.ArgumentTypeError(f"--knob: expected NAME=VALUE with NAME one of "
                                         f"{', '.join(KNOBS)}, got {text!r}")
    return name, type(KNOBS[name])(float(value))


def ideal(wl: Workload) -> Workload:
    """The same workload with every card large enough for all its engines at their declared
    size: no policy can wait less for memory. Replayed under ``current-need`` (nothing is ever
    evicted and nothing collides), it gives the floor set by the engines' own queues."""
    need: dict[str, int] = {}
    for e in wl.engines:
        for p, b in e.size_bytes.items():
            need[p] = need.get(p, 0) + b
    cards = tuple(replace(c, total_bytes=max(c.total_bytes, need.get(c.pci, 0)))
                  for c in wl.cards)
    return replace(wl, cards=cards)


def commit() -> str:
    """``<short hash>``, which of core/ and bench/policy/ had uncommitted changes, and where
    ``berth`` was imported from when that is not this checkout's core/."""
    root = HERE.parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [d for d in ("core", "bench/policy")
             if git("status", "--porcelain", "--untracked-files=no", "--", d)]
    out = head + (f" (uncommitted changes in {', '.join(dirty)})" if dirty else "")
    core = Path(berth.__file__).resolve().parent
    if core != (root / "core").resolve():
        out += f" (berth imported from {core}, not this checkout's core/)"
    return out


def _need_matplotlib() -> None:
    """The plots need matplotlib, the ``bench`` extra (no dependency of Berth or of its tests):
    say so before the replay, not after it (issue 38)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("the plots need matplotlib: pip install -e '.[bench]' (or pass "
                         "--no-plots)") from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Berth's ladder against the peers' policies.")
    ap.add_argument("--workload", action="append", help="a workload name or .json path "
                    f"(repeatable; default all: {', '.join(WORKLOADS)})")
    ap.add_argument("--policy", action="append", choices=list(POLICIES),
                    help="repeatable; default all")
    ap.add_argument("--seed", type=int, help="replay the workloads gen.py makes from this seed "
                    "instead of the committed files (not written anywhere)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_WORKLOAD} only, its first {QUICK_S:.0f} s (a few seconds)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--out", default=str(HERE / "out"), help="where the plots go")
    ap.add_argument("--figures", help="also copy the plots into this folder")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-ideal", action="store_true",
                    help="skip the reference row replayed with no memory limit")
    ap.add_argument("--check", action="store_true", help="audit the accounting after every event")
    ap.add_argument("--knob", action="append", type=_knob, default=[], metavar="NAME=VALUE",
                    help="override one of Berth's policy knobs (repeatable)")
    ap.add_argument("--seeds", help="with --verdict: these seeds (N-M or N,M,...), every "
                    "workload each draws; prints the table of cells held (yardstick.py)")
    ap.add_argument("--verdict", action="store_true",
                    help="with --seeds: only the peers and berth-default, judged, with the "
                    "hindsight row (the best fixed rent per cell)")
    ap.add_argument("--no-hindsight", action="store_true", help="with --seeds: skip the "
                    "hindsight row (8 more runs per cell)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.seeds or args.verdict:
        return _seeds(ap, args)
    if not args.no_plots:
        _need_matplotlib()

    if args.seed is not None:
        from .gen import build_every
        built = build_every(args.seed)
        names = args.workload or ([QUICK_WORKLOAD] if args.quick else list(WORKLOADS))
        unknown = [n for n in names if n not in built]
        if unknown:
            raise SystemExit(f"--seed: unknown workload {unknown[0]!r} (known: {', '.join(built)})")
        workloads = [built[n].truncated(QUICK_S) if args.quick else built[n] for n in names]
    elif args.quick:
        workloads = [load_workload(QUICK_WORKLOAD).truncated(QUICK_S)]
    else:
        workloads = [load_workload(n) for n in (args.workload or WORKLOADS)]
    policies = args.policy or list(POLICIES)
    rev = commit()
    knobs = dict(args.knob)
    print(f"commit: {rev}")
    print("berth knobs: " + ", ".join(f"{k}={v:g}" for k, v in {**KNOBS, **knobs}.items()))
    from .policies.berth import DEFAULT_KNOBS, DEFAULT_RESERVE_BYTES
    print(f"{DEFAULT} knobs (a new install's): "
          + ", ".join(f"{k}={v:g}" for k, v in {**DEFAULT_KNOBS, **knobs}.items())
          + f", reserve {DEFAULT_RESERVE_BYTES / 2**20:.0f} MiB per card, front forwards each engine's slots")
    t0 = time.perf_counter()
    runs: dict[str, dict] = {}
    recorders = {}
    rows = []
    for wl in workloads:
        for pol in policies:
            rec = run_one(wl, pol, args.check, knobs)
            recorders[(wl.name, pol)] = rec
            runs[f"{wl.name}/{pol}"] = rec.summary
            rows.append((wl.name, f"**{pol}** (default)" if pol == DEFAULT else pol,
                         rec.summary))
        if not args.no_ideal:
            rec = run_one(ideal(wl), "current-need", args.check)
            rec.policy = "ideal"
            recorders[(wl.name, "ideal")] = rec
            runs[f"{wl.name}/ideal"] = rec.summary
            rows.append((wl.name, "ideal (no memory limit)", rec.summary))
    print(table(rows))
    free = {wl.name for wl in workloads if any(e.free for e in wl.engines)}
    if free:
        print("\nEach engine's cards, where a policy that places chose them (issue 25):")
        print(cards_table([r for r in rows if r[0] in free]))
    verdicts = {}
    for wl in workloads:
        v = verdict(runs, wl.name)
        if v is not None:
            verdicts[wl.name] = v
            runs[f"{wl.name}/{DEFAULT}"]["verdict"] = v
            print("\n".join(lines(wl.name, v)))
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.1f} s of CPU time")
    if not args.no_plots:
        from .plots import write_plots
        paths = write_plots(recorders, Path(args.out), rev)
        if args.figures:
            dest = Path(args.figures)
            dest.mkdir(parents=True, exist_ok=True)
            for p in paths:
                shutil.copy(p, dest / p.name)
        print("plots: " + ", ".join(str(p) for p in paths))
    if args.json:
        # Each request's wait by name (the verdict's pairing) stays out: it is the bulk.
        print(json.dumps({k: {f: v for f, v in s.items() if f != "request_waits"}
                          for k, s in runs.items()}, sort_keys=False))
    return 0


def _seeds(ap: argparse.ArgumentParser, args) -> int:
    """``--seeds A-B --verdict``: the yardstick's table over many seeds (:mod:`.yardstick`)."""
    from . import yardstick
    if not (args.seeds and args.verdict):
        ap.error("--seeds and --verdict go together (e.g. --seeds 1-10 --verdict)")
    try:
        seeds = yardstick.parse_seeds(args.seeds)
    except ValueError as exc:
        ap.error(str(exc))
    knobs = dict(args.knob)
    print(f"commit: {commit()}")
    t0 = time.perf_counter()
    m = yardstick.measure(seeds, args.workload, knobs, hindsight=not args.no_hindsight,
                          progress=lambda s: print(f"seed {s}: {time.perf_counter() - t0:.0f} s",
                                                   file=sys.stderr))
    print(yardstick.table(m, seeds))
    print(f"{len(seeds)} seeds in {time.perf_counter() - t0:.0f} s")
    if args.json:
        print(json.dumps(m))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
