"""Issue 24, live: two busy clients, one per engine, on one card (the ping-pong).

Two 14 GiB stub engines behind ``berth run --park checkpoint`` on one simulated 24 GiB card
(host RAM for both parks, the stand-in cuda-checkpoint at the seed's 7 GB/s), berthd's default
policy (only the reads made faster, as in ``berth demo``), with the parameters of
``bench/policy/workloads/e-ping-pong.json``: A is loaded, then B (A parks for it), then one
client per engine sends a chat, waits for its answer, pauses 1 s, and sends again, for 90 s
(here cut after 60 s, :data:`RUN_S`).
Before the issue every pause made the holder "idle", it yielded at once, and every request paid
a full park and restore: 10 to 13 answered in 90 s (10 on this machine, at a load average of
about 12). An idle holder that expects demand keeps its card while its client comes back
within what a switch back costs, inside its minimum turn (issue 34: past it, the other side's
older request goes first). The simulator's replay of the same file
agrees on who is served first and on the switches per request answered.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from tests.helpers import sweep
from tests.run.shapes import Live, agree_per_request, shortened, simulate, workload

#: Seconds the two clients send for: the file's 90 s cut at 60 (issue 38: the suite's length).
#: The simulator's replay of the cut file: 7 parks in 46 answered (the whole file: 9 in 66);
#: the turns, the per-side floor and the agreement are all still tried.
RUN_S = 60.0


@pytest.mark.early(105)
@pytest.mark.timeout(500)
def test_two_busy_clients_are_served_in_turns_not_one_switch_per_request(tmp_path):
    file_wl = workload("e-ping-pong")
    start = file_wl.generator["clients_start_s"]
    wl = replace(shortened(file_wl, start + RUN_S), generator={
        **file_wl.generator, "run_s": RUN_S, "shortened_to_s": start + RUN_S})
    end = start + wl.generator["run_s"]
    lv = Live(tmp_path, wl).start()
    try:
        lv.run(limit_s=150)
        sim = simulate(wl)
        rows = [r for r in lv.rows if r.sent - lv.t0 >= start]
        window = lv.answered_in_window()
        answered = {e: window.get(e, []) for e in ("A", "B")}
        load = os.getloadavg()
        print(f"answered in {end - start:g}s: A {len(answered['A'])}, B {len(answered['B'])}; "
              f"live {lv.outcome()}, sim {sim}; load average {load[0]:.1f}")
        for e in ("A", "B"):
            print(e, " ".join(f"{r.sent - lv.t0:.1f}+{(r.first or r.sent) - r.sent:.1f}"
                              for r in rows if r.engine == e))
        bad = [(r.engine, round(r.sent - lv.t0, 1), r.status) for r in lv.rows
               if r.status != "200"]
        assert not bad, bad
        assert lv.d.sim_oom() == 0
        # Turns, not a switch per request: before issue 24 every answer paid a park and a
        # restore (10 parks in 10 to 13 answered); in turns, each park buys several answers.
        # How many are answered in the window is a speed, so it is not asserted here: the
        # acceptance figure (>= 45 on a quiet machine) is printed above and by
        # `python bench/pingpong.py`.
        total = len(answered["A"]) + len(answered["B"])
        assert min(len(a) for a in answered.values()) >= 5, answered
        assert lv.outcome().switches * 4 <= total, (lv.outcome(), total)
        # Closed-loop clients send as fast as the machine answers, so the switches are compared
        # per request answered (a quiet CI run: live 6 parks in 54, the replay 8 in 66).
        assert agree_per_request(lv.outcome(), sim), (lv.outcome(), sim)
    finally:
        lv.close()
        sweep(tmp_path)
