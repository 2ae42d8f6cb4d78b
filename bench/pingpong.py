"""The ping-pong shape live (issue 24, issue 34's acceptance): how many requests are answered.

Two busy clients, one per 14 GiB engine, on one simulated 24 GiB card, with the parameters of
``bench/policy/workloads/e-ping-pong.json`` (1 s pause, 90 s), berthd's default policy, both
engines parking by the stand-in cuda-checkpoint: the live set-up of
``tests/run/test_ping_pong.py`` (:class:`tests.run.shapes.Live`). The test checks the shape
(turns, not a switch per request); this script prints the speed, which the test does not
assert because a loaded machine answers fewer:

    python bench/pingpong.py [--json]

Prints ``answered`` (A and B, answered within the 90 s), ``parks``, ``drains``, ``errors`` (any
answer that was not 200), ``sim_oom``, the simulator's replay of the same file beside it
(``sim_answered``, ``sim_parks``), the target (``target_answered`` 45, each side 10), whether
it ``holds``, and the load average while it ran. A quiet machine is needed for the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.run.shapes import Live, simulate, workload  # noqa: E402

TARGET_ANSWERED = 45
TARGET_EACH = 10


def measure(tmp: Path) -> dict:
    """One live run of e-ping-pong; the figures as the module docstring lists them."""
    wl = workload("e-ping-pong")
    lv = Live(tmp, wl).start()
    try:
        lv.run(limit_s=150)
        out = lv.outcome()
        window = lv.answered_in_window()
        answered = {e: len(window.get(e, [])) for e in ("A", "B")}
        errors = sum(1 for r in lv.rows if r.status != "200")
        oom = lv.d.sim_oom()
    finally:
        lv.close()
    sim = simulate(wl)
    total = sum(answered.values())
    return {"answered": total, "answered_by_engine": answered, "parks": out.parks,
            "drains": out.drains, "errors": errors, "sim_oom": oom,
            "sim_answered": sim.answered, "sim_parks": sim.parks,
            "target_answered": TARGET_ANSWERED, "target_each": TARGET_EACH,
            "holds": total >= TARGET_ANSWERED and min(answered.values()) >= TARGET_EACH
            and errors == 0 and oom == 0,
            "load_average": round(os.getloadavg()[0], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="berth-pingpong-") as tmp:
        fig = measure(Path(tmp))
    if args.json:
        print(json.dumps(fig))
    else:
        by = fig["answered_by_engine"]
        print(f"answered in 90 s: {fig['answered']} (A {by['A']}, B {by['B']}; target "
              f">= {TARGET_ANSWERED}, each >= {TARGET_EACH}); parks {fig['parks']}, drains "
              f"{fig['drains']}, errors {fig['errors']}, OOM {fig['sim_oom']}; the simulator: "
              f"{fig['sim_answered']} answered, {fig['sim_parks']} parks; load average "
              f"{fig['load_average']}; {'holds' if fig['holds'] else 'does not hold'}")
    return 0 if fig["holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
