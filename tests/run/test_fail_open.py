"""``berth run`` fails open (issue 5; seed 002 "Why the run owns the front": "With berthd down it
still forwards"): berthd down at the start, and berthd killed and restarted under a serving run."""

from __future__ import annotations

import subprocess

from tests.berthd import BERTH
from tests.helpers import wait_for
from tests.run.llamaswap import UNLOAD_TIMEOUT_S
from tests.run.world import chat, run_cmd


def test_berthd_down_at_start_the_run_warns_and_serves_unleased(world):
    # The simulated card exists (as a real one would); no berthd runs.
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(world.tmp / "sim")], check=True, capture_output=True)
    assert not world.d.sock.exists()
    a = world.model("A", run_cmd("A"))
    a.start()
    assert "UNLEASED (fail-open)" in world.log("A")
    for _ in range(2):
        ans = chat(a.port, "A", max_tokens=6)
        assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    # berthd comes up: the run leases its running engine (it keeps serving meanwhile).
    d = world.start_berthd()
    le = wait_for(lambda: d.lease_of("A"), 60, "the run's lease")
    wait_for(lambda: d.state_of("A") == "active" and (d.lease_of("A") or {}).get("pid"), 60,
             "the lease granted and attached")
    assert d.lease_of("A")["pid"] == world.engine_pid("A") == le["pid"]
    # The engine ran before berthd measured the card: its bytes left the baseline on adoption.
    assert d.status()["cards"][0]["baseline_bytes"] == 0
    ans = chat(a.port, "A", max_tokens=6)
    assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    st = a.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st


def test_berthd_killed_the_run_keeps_serving_and_reattaches_when_it_is_back(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    a.start()
    before = d.lease_of("A")
    pid = world.engine_pid("A")
    d.kill9()
    for _ in range(2):                      # the front forwards with berthd gone
        ans = chat(a.port, "A", max_tokens=6)
        assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    d.start()
    after = d.lease_of("A")
    assert after["id"] == before["id"] and after["pid"] == pid, (before, after)
    assert d.state_of("A") == "active"
    # Instructions reach the run again: the operator parks it through the new berthd...
    out = subprocess.run([BERTH, "park", "A"], env=world.env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: d.state_of("A") == "parked", 60, "A parked through the new berthd")
    # ...and a write to the front wakes it through the new berthd.
    ans = chat(a.port, "A", max_tokens=6)
    assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    wait_for(lambda: d.state_of("A") == "active", 30, "A's wake reported")
    assert [c.oom_events for c in world.sim().cards] == [0]
    st = a.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st


def _sim_card(world) -> None:
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(world.tmp / "sim")], check=True, capture_output=True)


def test_berthd_down_a_run_that_does_not_fit_waits_for_berthd(world):
    """Issue 26: with berthd down, B (14 GiB) does not fit beside A (13 GiB held of 24 GiB, a
    1 GiB reserve): B starts no engine and says it waits for berthd; A keeps serving. Once
    berthd is back, A (unleased) registers and is admitted like a stowaway, and B is leased in
    its turn. No out-of-memory event on the card."""
    _sim_card(world)
    a = world.model("A", run_cmd("A"))
    a.start()
    b = world.model("B", run_cmd("B"))
    b.spawn()
    wait_for(lambda: "Waiting for berthd" in world.log("B") or "started B" in world.log("B"),
             30, "B to say it waits")
    assert "started B" not in world.log("B") and b.running(), world.log("B")
    assert "does not fit beside what gpu0 holds" in world.log("B"), world.log("B")
    assert len(world.sim().cards[0].processes) == 1          # A's engine only
    assert "UNLEASED (fail-open): it fits beside what the cards hold" in world.log("A")
    assert chat(a.port, "A", max_tokens=4).content_chunks == 4
    d = world.start_berthd()
    wait_for(lambda: d.state_of("A") == "active" and (d.lease_of("A") or {}).get("pid"), 20,
             "A registered and attached")
    b.wait_ready()                          # B's lease: the ladder parks A for it
    ans = chat(b.port, "B", max_tokens=4)
    assert ans.content_chunks == 4, ans
    assert [c.oom_events for c in world.sim().cards] == [0]


def test_berthd_down_past_the_start_limit_the_run_gives_up(world):
    _sim_card(world)
    a = world.model("A", run_cmd("A"))
    a.start()
    b = world.model("B", run_cmd("B", run_args=("--start-limit", "2s")))
    b.spawn()
    assert b.proc.wait(60) == 1, world.log("B")
    assert "did not come back within --start-limit 2s" in world.log("B"), world.log("B")
    assert "started B" not in world.log("B")
    assert [c.oom_events for c in world.sim().cards] == [0]
