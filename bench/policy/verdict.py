"""Berth's default against the best peer, per workload: issue 34's yardstick, as figures.

For ``berth-default`` on one workload (all from the runs' summaries, :mod:`.metrics`), against
``best_peer``, the peer (``swap``, ``swap-matrix``, ``keepalive-evict``) with zero OOM and the
lowest aggregate p95 wait. The two p95 tests compare **the same requests** (issue 34, third
pass): those both runs made (:func:`paired`). A closed-loop client's n-th request is the same
request under every policy, but a policy that answers faster gets further into the client's
sequence, and its extra requests (the peer never made them) would otherwise weigh in its
percentiles alone:

- ``oom_events``: must be 0;
- ``p95``: the default's aggregate p95 wait <= the best peer's (``ratio_to_best_peer`` <= 1);
- ``engines``: each engine's p95 under the default <= ``ENGINE_SLACK`` (1.1) x its p95 under
  the best peer (an engine the peer serves at 0 s must be served at 0 s too), so an aggregate
  cannot hide a starved engine;
- ``longest``: the default's longest wait <= ``ENGINE_SLACK`` x the best peer's (a starved
  closed-loop client sends fewer requests, so its waits weigh less in a percentile);
- ``answered``: requests answered >= ``ANSWERED_FLOOR`` (0.98) x the best peer's (closed-loop
  clients send the next request only after an answer: a slow policy gets fewer);
- ``holds``: all four, and zero OOM.

``ratio_to_ideal`` (the default's p95 over the no-memory-limit ``ideal`` row's) is a floor, not
a test: ``None`` where the ideal is 0 s.
"""

from __future__ import annotations

import numpy as np

from .policies import DEFAULT, PEERS

__all__ = ["verdict", "lines", "paired", "ENGINE_SLACK", "ANSWERED_FLOOR", "TESTS", "best_peer"]

_EPS = 1e-6
ENGINE_SLACK = 1.1
ANSWERED_FLOOR = 0.98
#: the four parts of "holds", in table order
TESTS = ("p95", "engines", "longest", "answered")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > _EPS else (1.0 if a <= _EPS else None)


def best_peer(runs: dict[str, dict], workload: str) -> str | None:
    """The peer with zero OOM and the lowest aggregate p95 on ``workload`` (ties: PEERS order);
    ``None`` when no peer ran there with zero OOM."""
    clean = [p for p in PEERS if f"{workload}/{p}" in runs
             and runs[f"{workload}/{p}"]["oom_events"] == 0]
    return min(clean, key=lambda p: runs[f"{workload}/{p}"]["p95_wait_s"]) if clean else None


def _p95(waits: list[float]) -> float:
    return round(float(np.percentile(np.asarray(waits, dtype=float), 95)), 3) if waits else 0.0


def paired(d: dict, peer: dict) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """Over the requests both runs made (``request_waits``' keys common to both; every request
    when either summary lacks them): ``(d's p95, peer's p95, {engine: (d's p95, peer's)})``,
    waits in seconds. An engine with no common request compares as 0 s against 0 s."""
    mine, theirs = d.get("request_waits"), peer.get("request_waits")
    if mine is None or theirs is None:
        return d["p95_wait_s"], peer["p95_wait_s"], {
            e: (p, peer["p95_wait_by_engine_s"].get(e, 0.0))
            for e, p in d["p95_wait_by_engine_s"].items()}
    keys = [k for k in mine if k in theirs]
    by_engine: dict[str, tuple[list[float], list[float]]] = {
        e: ([], []) for e in d["p95_wait_by_engine_s"]}
    for k in keys:
        a, b = by_engine.setdefault(mine[k][0], ([], []))
        a.append(mine[k][1])
        b.append(theirs[k][1])
    return (_p95([mine[k][1] for k in keys]), _p95([theirs[k][1] for k in keys]),
            {e: (_p95(a), _p95(b)) for e, (a, b) in by_engine.items()})


def judge(d: dict, peer: dict) -> dict:
    """The four tests of one run's summary ``d`` against the peer's summary ``peer``; the
    p95s are :func:`paired`'s."""
    mine_p95, peer_p95, by_engine = paired(d, peer)
    engines = {}
    for e, (p95, theirs) in by_engine.items():
        engines[e] = {"p95_wait_s": p95, "peer_p95_wait_s": theirs, "ratio": _ratio(p95, theirs),
                      "holds": p95 <= ENGINE_SLACK * theirs + _EPS}
    longest = {"max_wait_s": d["max_wait_s"], "peer_max_wait_s": peer["max_wait_s"],
               "ratio": _ratio(d["max_wait_s"], peer["max_wait_s"])}
    answered = {"answered": d["answered"], "peer_answered": peer["answered"],
                "ratio": _ratio(d["answered"], peer["answered"])}
    tests = {"p95": mine_p95 <= peer_p95 + _EPS,
             "engines": all(v["holds"] for v in engines.values()),
             "longest": d["max_wait_s"] <= ENGINE_SLACK * peer["max_wait_s"] + _EPS,
             "answered": d["answered"] >= ANSWERED_FLOOR * peer["answered"] - _EPS}
    return {"engines": engines, "longest": longest, "answered": answered, "tests": tests,
            "paired_p95_wait_s": mine_p95, "peer_paired_p95_wait_s": peer_p95,
            "holds": d["oom_events"] == 0 and all(tests.values())}


def verdict(runs: dict[str, dict], workload: str, policy: str = DEFAULT) -> dict | None:
    """``policy``'s figures on ``workload`` (``runs`` keyed ``<workload>/<policy>``) against
    the best zero-OOM peer; ``None`` when the policy did not run there or no peer ran clean."""
    d = runs.get(f"{workload}/{policy}")
    best = best_peer(runs, workload)
    if d is None or best is None:
        return None
    peer = runs[f"{workload}/{best}"]
    ideal = runs.get(f"{workload}/ideal")
    j = judge(d, peer)
    return {"oom_events": d["oom_events"], "p95_wait_s": d["p95_wait_s"], "best_peer": best,
            "best_peer_p95_wait_s": peer["p95_wait_s"],
            "ratio_to_best_peer": _ratio(j["paired_p95_wait_s"], j["peer_paired_p95_wait_s"]),
            "ratio_to_ideal": _ratio(d["p95_wait_s"], ideal["p95_wait_s"]) if ideal else None,
            **j}


def lines(workload: str, v: dict, policy: str = DEFAULT) -> list[str]:
    """The verdict in words, a few lines for the terminal and the README."""
    r = v["ratio_to_best_peer"]
    failed = [t for t in TESTS if not v["tests"][t]]
    out = [f"{workload}/{policy}: {'HOLDS' if v['holds'] else 'DOES NOT HOLD'}"
           f"{' (' + ', '.join(failed) + ')' if failed else ''}; OOM {v['oom_events']}; "
           f"p95 {v['p95_wait_s']:.1f} s vs best zero-OOM peer {v['best_peer']} "
           f"{v['best_peer_p95_wait_s']:.1f} s; over the requests both made "
           f"{v['paired_p95_wait_s']:.1f}/{v['peer_paired_p95_wait_s']:.1f} s "
           f"(x{r if r is not None else 'n/a'}); "
           f"longest {v['longest']['max_wait_s']:.1f}/{v['longest']['peer_max_wait_s']:.1f} s; "
           f"answered {v['answered']['answered']}/{v['answered']['peer_answered']}"]
    out.append(f"  per engine p95 (default / {v['best_peer']}): " + ", ".join(
        f"{e} {x['p95_wait_s']:.1f}/{x['peer_p95_wait_s']:.1f}{'' if x['holds'] else ' !'}"
        for e, x in v["engines"].items()))
    return out
