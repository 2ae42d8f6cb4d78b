"""Issue 34's yardstick over many seeds: which cells ``berth-default`` holds, the geometric
means, and the hindsight row.

    python bench/policy/run.py --seeds 1-10 --verdict         # the table (a few minutes)
    python bench/policy/run.py --seeds 1-10 --verdict --json  # and its figures as JSON

For each seed and each workload :func:`~.gen.build_every` draws, the peers and ``berth-default``
run, and :func:`~.verdict.verdict` judges the default against the best zero-OOM peer (the
four tests: aggregate p95, each engine's p95, the longest wait, requests answered). A cell is
``ok`` when all four hold with zero OOM, else it names the tests that failed; its number is the
default's p95 over the peer's.

**The hindsight row** (issue 34): the same core with a fixed rent instead of its rent-or-buy
rule (``Policy.rent_fixed_s``; an idle holder keeps its card that many seconds), every value of
:data:`RENT_GRID` tried on each cell, the best chosen after the fact (the one that holds, then
the lowest p95). It shows how far the default is from the best the plain rule could do on that
very trace; no single fixed rent is that good everywhere.
"""

from __future__ import annotations

import math

from .gen import build_every
from .policies import DEFAULT, PEERS, make
from .verdict import TESTS, verdict
from .world import World

__all__ = ["RENT_GRID", "parse_seeds", "measure", "table"]

#: fixed rents tried for the hindsight row (seconds)
RENT_GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_FLOOR = 0.01      # a ratio below this counts as this in a geometric mean (a 0 s p95)
_SHORT = {"p95": "p95", "engines": "eng", "longest": "max", "answered": "ans"}


def parse_seeds(text: str) -> list[int]:
    """``"1-10"``, ``"3"`` or ``"1,4,7"`` as a list of seeds; ``ValueError`` naming the text."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--seeds: expected N, N-M or N,M,..., got {text!r}") from None
    if not out:
        raise ValueError(f"--seeds: no seed in {text!r}")
    return out


def _run(wl, policy: str, knobs: dict | None = None) -> dict:
    return World(wl, make(policy, knobs)).run().summary


def _cell(v: dict) -> dict:
    failed = [t for t in TESTS if not v["tests"][t]] + (["oom"] if v["oom_events"] else [])
    return {"holds": v["holds"], "ratio": v["ratio_to_best_peer"], "failed": failed,
            "p95_wait_s": v["p95_wait_s"], "best_peer": v["best_peer"],
            "best_peer_p95_wait_s": v["best_peer_p95_wait_s"]}


def measure(seeds: list[int], workloads: list[str] | None = None, knobs: dict | None = None,
            hindsight: bool = True, progress=None) -> dict:
    """``{"cells": {workload: {seed: cell}}, "hindsight": {workload: {seed: cell + rent_s}}}``
    where a cell is ``{"holds", "ratio", "failed", ...}`` (see the module docstring)."""
    cells: dict[str, dict[int, dict]] = {}
    best: dict[str, dict[int, dict]] = {}
    for seed in seeds:
        built = build_every(seed)
        for name in workloads or list(built):
            wl = built[name]
            runs = {f"{name}/{p}": _run(wl, p) for p in PEERS}
            runs[f"{name}/{DEFAULT}"] = _run(wl, DEFAULT, knobs)
            v = verdict(runs, name)
            if v is None:
                continue
            cells.setdefault(name, {})[seed] = _cell(v)
            if hindsight:
                best.setdefault(name, {})[seed] = _hindsight(wl, runs, name, knobs)
        if progress:
            progress(seed)
    return {"cells": cells, "hindsight": best}


def _hindsight(wl, runs: dict, name: str, knobs: dict | None) -> dict:
    tried = []
    for rent in RENT_GRID:
        key = f"{name}/rent-{rent:g}"
        runs[key] = _run(wl, DEFAULT, {**(knobs or {}), "rent_fixed_s": rent})
        v = verdict(runs, name, policy=f"rent-{rent:g}")
        tried.append((not v["holds"], v["p95_wait_s"], rent, v))
    _, _, rent, v = min(tried, key=lambda t: t[:3])
    return {**_cell(v), "rent_s": rent}


def _geomean(xs: list[float | None]) -> float | None:
    xs = [max(x, _FLOOR) for x in xs if x is not None]
    return round(math.exp(sum(map(math.log, xs)) / len(xs)), 3) if xs else None


def _fmt(c: dict, rent: bool = False) -> str:
    r = "n/a" if c["ratio"] is None else f"{c['ratio']:.2f}"
    head = f"{c['rent_s']:g}s " if rent else ""
    if c["holds"]:
        return f"{head}ok {r}"
    return f"{head}{r} " + ",".join(_SHORT.get(t, t) for t in c["failed"])


def table(m: dict, seeds: list[int]) -> str:
    """The Markdown table: one row per workload (its cells by seed, cells held, the geometric
    mean of p95 / best peer), its hindsight row under it, and the totals."""
    head = "| workload | " + " | ".join(f"seed {s}" for s in seeds) + " | held | geomean |"
    out = [head, "|" + "---|" * (len(seeds) + 3)]
    held = total = 0
    ratios: list[float | None] = []
    h_held = 0
    h_ratios: list[float | None] = []
    for name, by_seed in m["cells"].items():
        row = [by_seed.get(s) for s in seeds]
        n = sum(1 for c in row if c and c["holds"])
        held, total = held + n, total + sum(1 for c in row if c)
        rs = [c["ratio"] for c in row if c]
        ratios += rs
        out.append(f"| {name} | " + " | ".join(_fmt(c) if c else "" for c in row)
                   + f" | {n}/{len(rs)} | {_geomean(rs)} |")
        hb = m["hindsight"].get(name)
        if hb:
            hrow = [hb.get(s) for s in seeds]
            hn = sum(1 for c in hrow if c and c["holds"])
            h_held += hn
            hr = [c["ratio"] for c in hrow if c]
            h_ratios += hr
            out.append("| ↳ best fixed rent | " + " | ".join(
                _fmt(c, rent=True) if c else "" for c in hrow) + f" | {hn}/{len(hr)} | "
                f"{_geomean(hr)} |")
    out.append(f"| **all** ({DEFAULT}) | " + " | ".join("" for _ in seeds)
               + f" | **{held}/{total}** | **{_geomean(ratios)}** |")
    if m["hindsight"]:
        out.append("| **all** (best fixed rent, hindsight) | " + " | ".join("" for _ in seeds)
                   + f" | **{h_held}/{total}** | **{_geomean(h_ratios)}** |")
    return "\n".join(out)
