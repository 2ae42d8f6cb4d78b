"""The supervisord host against a real supervisord: observe, drain, gate, a killed listener, a
program over budget (issue 7 acceptance)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from berth_hosts.supervisor.plugin import START_TOLERANCE_S

from tests.helpers import wait_for

from .conftest import Prog, engine_cmd, free_port


def _same_process(lease: dict, info) -> bool:
    """The lease holds the process supervisord runs: same PID, start times within tolerance
    (supervisord's ``start`` is whole seconds)."""
    return lease["pid"] == info.pid and abs(lease["start_time"] - info.start) <= START_TOLERANCE_S


@pytest.mark.early(10)
def test_observe_drain_gate_restart_over_budget(stack_factory):
    progs = [Prog("vllm-a", engine_cmd(free_port(), "10GiB"), engine="vllm-a"),
             Prog("vllm-b", engine_cmd(free_port(), "10GiB"), engine="vllm-b"),
             Prog("vllm-c", engine_cmd(free_port(), "10GiB"), engine="vllm-c", mode="gate",
                  autostart=False),
             Prog("small-d", engine_cmd(free_port(), "1GiB"), engine="small-d", size="2GiB",
                  autostart=False)]
    s = stack_factory(progs)

    # Observe: the programs supervisord started are leased with its PIDs and start times.
    for name in ("vllm-a", "vllm-b"):
        lease = wait_for(lambda n=name: s.active(n), 40, f"an active lease for {name}")
        info = s.info(name)
        assert _same_process(lease, info), (lease, info)
        assert abs(lease["start_time"] - psutil.Process(info.pid).create_time()) < 0.05

    # Gate: vllm-c does not fit beside them (11 + 11 + 11 GiB > 23.5 GiB); it stays stopped.
    wait_for(lambda: s.waiting("vllm-c"), 30, "vllm-c's lease to wait")
    assert s.info("vllm-c").statename == "STOPPED"
    assert "running" not in s.waiting("vllm-c")        # nothing runs for it yet
    a_lease = s.active("vllm-a")["id"]

    # A drain stops the program through supervisord; the lease ends once the driver confirms.
    s.berth("drain", "vllm-a")
    wait_for(lambda: "STOPPED" in s.ctl("status", "vllm-a"), 30, "supervisorctl: vllm-a STOPPED")
    wait_for(lambda: not s.leases("vllm-a"), 30, "vllm-a's lease to end")
    kinds = [e["kind"] for e in s.berth_timeline(a_lease)]
    assert "drain" in kinds and "freed" in kinds, kinds
    assert kinds.index("freed") > kinds.index("drain")

    # ... which makes room: Berth starts vllm-c through supervisord, and leases it.
    wait_for(lambda: s.info("vllm-c").statename == "RUNNING", 40, "vllm-c started by Berth")
    c_info = s.info("vllm-c")
    c_lease = wait_for(lambda: s.active("vllm-c", c_info.pid), 30, "vllm-c's lease on its pid")
    assert _same_process(c_lease, c_info)
    wait_for(lambda: "vllm-c: lease" in (t := s.log("listener.log"))
             and "started through supervisord" in t, 20,
             "the listener's log (supervisord copies it) to tell of the start")
    assert s.info("vllm-a").statename == "STOPPED"      # operator drain: it stays down

    # Killing the listener: supervisord restarts it, it finds its leases, nothing duplicates.
    before = {e: s.active(e)["id"] for e in ("vllm-b", "vllm-c")}
    old = s.info("berth").pid
    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: (i := s.info("berth")).statename == "RUNNING" and i.pid != old
                   and i.pid, 40, "supervisord to restart the listener")
    wait_for(lambda: s.mapping().get("listener_pid") == new and s.mapping()["syncs"] >= 1, 40,
             "the restarted listener's first sync")
    for engine, lid in before.items():
        assert [le["id"] for le in s.leases(engine)] == [lid], s.leases(engine)
    assert s.mapping()["programs"]["vllm-c"]["lease"] == before["vllm-c"]

    # Over budget: a program started by hand that does not fit runs with a waiting lease.
    assert "started" in s.ctl("start", "small-d")
    d_pid = s.info("small-d").pid
    w = wait_for(lambda: (x := s.waiting("small-d")) and x.get("running") and x, 30,
                 "small-d waiting while it runs")
    assert w["pid"] == d_pid and "over budget" in w["note"]
    board = s.berth("status").stdout
    assert "small-d" in board and "over budget" in board, board
    assert len(s.leases("small-d")) == 1
    assert s.info("small-d").statename == "RUNNING"     # Berth never signals it (rule 6)
    # The operator drains it while it waits: supervisord stops it, nothing leases it again.
    s.berth("drain", "small-d")
    wait_for(lambda: "STOPPED" in s.ctl("status", "small-d"), 30, "small-d stopped")
    wait_for(lambda: not s.leases("small-d") and not s.waiting("small-d"), 30,
             "small-d's lease to be gone")


def test_gate_program_drained_for_room_is_started_again_when_room_frees(stack_factory):
    progs = [Prog("filler", engine_cmd(free_port(), "10GiB"), engine="filler", priority=50),
             Prog("gated", engine_cmd(free_port(), "10GiB"), engine="gated", mode="gate",
                  autostart=False, priority=0),
             Prog("urgent", engine_cmd(free_port(), "1GiB"), engine="urgent", size="2GiB",
                  autostart=False, priority=100)]
    s = stack_factory(progs, policy={"min_turn": "0s"})
    first = wait_for(lambda: s.info("gated").statename == "RUNNING" and s.info("gated").pid,
                     40, "Berth to start the gated program")
    wait_for(lambda: s.active("gated", first), 30, "the gated program's lease")

    # A program of higher priority is started by hand and does not fit: Berth makes room by
    # draining the gated program through supervisord; the urgent one is then granted.
    s.ctl("start", "urgent")
    wait_for(lambda: s.active("urgent"), 40, "the urgent program's lease to be granted")
    assert s.info("gated").statename == "STOPPED"
    assert s.info("filler").statename == "RUNNING"     # priority 50 > 0: the gated one went
    # The gated program wants its card back: its new lease waits, the program stays stopped.
    w = wait_for(lambda: s.waiting("gated"), 30, "the gated program to ask again")
    assert "running" not in w
    assert s.mapping()["programs"]["gated"]["down"] is False

    # Room frees (the operator stops the urgent one): Berth starts the gated program again.
    s.ctl("stop", "urgent")
    again = wait_for(lambda: (i := s.info("gated")).statename == "RUNNING" and i.pid != first
                     and i.pid, 40, "Berth to start the gated program again")
    lease = wait_for(lambda: s.active("gated", again), 30, "its new lease on the new pid")
    assert lease["id"] == w["id"]
