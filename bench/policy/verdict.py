"""Berth's default against the peers, per workload: the issue's acceptance, as figures.

For ``berth-default`` on one workload (all from the runs' summaries, :mod:`.metrics`):

- ``oom_events``: must be 0;
- ``p95_wait_s`` and ``best_peer``: the lowest p95 among the peers (``swap``, ``swap-matrix``,
  ``keepalive-evict``) that had zero OOM, and ``ratio_to_best_peer`` (≤ 1 passes);
- ``engines``: each engine's p95 under the default against its p95 under ``swap``
  (``ratio`` ≤ 1 passes; an engine swap serves at 0 s must be served at 0 s too);
- ``ratio_to_ideal``: the default's p95 over the no-memory-limit ``ideal`` row's (a floor, not a
  target: with ``ideal`` at 0 s the ratio is ``None``);
- ``holds``: every one of the three.
"""

from __future__ import annotations

from .policies import DEFAULT, PEERS

__all__ = ["verdict", "lines"]

_EPS = 1e-6


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > _EPS else (1.0 if a <= _EPS else None)


def verdict(runs: dict[str, dict], workload: str) -> dict | None:
    """The default's figures on ``workload`` (``runs`` keyed ``<workload>/<policy>``); None when
    the default or swap did not run there."""
    d, swap = runs.get(f"{workload}/{DEFAULT}"), runs.get(f"{workload}/swap")
    if d is None or swap is None:
        return None
    peers = {p: runs[f"{workload}/{p}"] for p in PEERS if f"{workload}/{p}" in runs}
    clean = {p: s for p, s in peers.items() if s["oom_events"] == 0}
    best = min(clean, key=lambda p: clean[p]["p95_wait_s"]) if clean else None
    best_p95 = clean[best]["p95_wait_s"] if best else None
    engines = {}
    for e, p95 in d["p95_wait_by_engine_s"].items():
        sw = swap["p95_wait_by_engine_s"].get(e, 0.0)
        engines[e] = {"p95_wait_s": p95, "swap_p95_wait_s": sw,
                      "ratio": _ratio(p95, sw), "holds": p95 <= sw + _EPS}
    ideal = runs.get(f"{workload}/ideal")
    out = {"oom_events": d["oom_events"], "p95_wait_s": d["p95_wait_s"], "best_peer": best,
           "best_peer_p95_wait_s": best_p95,
           "ratio_to_best_peer": _ratio(d["p95_wait_s"], best_p95) if best else None,
           "ratio_to_ideal": _ratio(d["p95_wait_s"], ideal["p95_wait_s"]) if ideal else None,
           "engines": engines}
    out["holds"] = (d["oom_events"] == 0 and best is not None
                    and d["p95_wait_s"] <= best_p95 + _EPS
                    and all(v["holds"] for v in engines.values()))
    return out


def lines(workload: str, v: dict) -> list[str]:
    """The verdict in words, a few lines for the terminal and the README."""
    r = v["ratio_to_best_peer"]
    out = [f"{workload}/{DEFAULT}: {'HOLDS' if v['holds'] else 'DOES NOT HOLD'}; "
           f"OOM {v['oom_events']}; p95 {v['p95_wait_s']:.1f} s vs best zero-OOM peer "
           f"{v['best_peer']} {v['best_peer_p95_wait_s'] or 0:.1f} s "
           f"(x{r if r is not None else 'n/a'}); vs ideal x{v['ratio_to_ideal']}"]
    out.append("  per engine p95 (default / swap): " + ", ".join(
        f"{e} {x['p95_wait_s']:.1f}/{x['swap_p95_wait_s']:.1f}{'' if x['holds'] else ' !'}"
        for e, x in v["engines"].items()))
    return out
