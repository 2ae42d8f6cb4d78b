"""Issue 12 case 3 on real processes: a checkpoint park on a host whose RAM budget holds the
engine once. berthd counts a parking lease's bytes against the RAM budget, and the checkpoint
plugin asks for the same bytes again: on main the park is refused ("needs 13.2GiB + a margin of
2.3GiB, and 4.0GiB is available") and falls back to a drain."""

from __future__ import annotations

from tests.berthd import wait_for

from .conftest import engine_run, free_port, run_log, serving


def test_a_park_that_the_ram_budget_holds_once_is_a_park_not_a_drain(berthd, runs):
    # 18 GiB: about what ram_budget = "auto" gives on a 24 GiB host. A 13.25 GiB engine and
    # the plugin's margin (10 % + 1 GiB) need 15.6 GiB of it.
    d = berthd(policy={"ram_budget": "18GiB"})
    engine_run(d, runs, "A", front=free_port(), park=True)
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    engine_run(d, runs, "B", front=free_port(), park=True)
    wait_for(lambda: serving(d, "B"), 60, "B serving once A made room")
    a = d.lease_of("A")
    assert a is not None and [s["state"] for s in a["shares"]] == ["parked"], \
        (a, run_log(d, "A")[-1500:])
    st = d.status()
    assert st["counters"]["fallbacks_to_drain"] == 0 and st["counters"]["checkpoints"] == 1
    assert st["host_ram"]["parked_bytes"] >= 13 * (1 << 30)
    assert "host RAM cannot hold the checkpoint" not in run_log(d, "A")
