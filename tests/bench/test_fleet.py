"""bench/fleet.py's books (issue 39): the static shares' first fit worked out by hand, what a
Pending pod's requests become, and the idle-card arithmetic. Virtual time; no sleeps."""

from __future__ import annotations

import json
import types

from bench import fleet
from bench.policy.gen import workload_b
from bench.policy.policies import DEFAULT, make

G0, G1, G2, G3 = (f"0000:0{i}:00.0" for i in range(1, 5))


def test_first_fit_leaves_the_shares_that_do_not_fit_pending():
    # Declared sizes on 24 GiB cards, in pod order: coder-14 14, chat-8 8 and embed-1.5 1.5 on
    # gpu0 (0.5 left); big-60 20 on gpu1-3 (4 left each); comfy 18 and chat-12 12 fit nowhere;
    # whisper-4 4 takes gpu1's last 4; vision-10 10 fits nowhere.
    placed, pending = fleet.first_fit(workload_b(fleet.node_seed(0)))
    assert pending == ["comfy", "chat-12", "vision-10"]
    assert placed == {"coder-14": (G0,), "chat-8": (G0,), "embed-1.5": (G0,),
                      "big-60": (G1, G2, G3), "whisper-4": (G1,)}


def test_static_shares_load_once_and_never_serve_a_pending_pod():
    wl = workload_b(fleet.node_seed(0)).truncated(900.0)
    world = fleet.FleetWorld(wl, fleet.StaticShares(), tail_s=300.0)
    s = world.run().summary
    pending = {"comfy", "chat-12", "vision-10"}
    asked = sum(1 for r in wl.requests if r.engine in pending)
    assert asked > 0
    assert s["unserved"] == asked, s
    assert s["switches_by_kind"] == {"load": 5, "drain": 0, "park": 0, "wake": 0, "lend": 0,
                                     "return": 0, "crash": 0}
    assert s["oom_events"] == 0
    # The allocated pods served every request of theirs; only the Pending ones' are left.
    assert {j.engine for j in world.jobs if j.done_s is None} == \
        {r.engine for r in wl.requests} & pending


def test_berth_serves_every_pod_of_the_node_without_oom():
    wl = workload_b(fleet.node_seed(0)).truncated(900.0)
    world = fleet.FleetWorld(wl, make(DEFAULT), tail_s=300.0)
    s = world.run().summary
    assert s["oom_events"] == 0
    assert s["unserved"] + s["dropped"] == 0, s
    assert 0.0 < world.idle_fraction(wl.duration_s) < 1.0


def test_idle_fraction_merges_overlapping_requests_per_card():
    w = types.SimpleNamespace(busy={G0: [(0.0, 10.0), (5.0, 20.0), (30.0, 40.0)],
                                    G1: [(90.0, 150.0)]})
    # gpu0 busy 0-20 and 30-40 (30 s), gpu1 busy 90-100 within the 100 s window (10 s).
    assert fleet.FleetWorld.idle_fraction(w, 100.0) == 1.0 - 40.0 / 200.0


def test_json_last_line_has_both_sides_and_the_ratios(capsys):
    assert fleet.main(["--nodes", "1", "--tail", "60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["nodes"] == 1 and out["k8s+berth"]["oom_events"] == 0
    assert out["k8s-static"]["pods_pending"] == 3
    assert set(out["ratios_berth_over_static"]) >= {"p95_wait_s", "cards_idle_fraction"}
