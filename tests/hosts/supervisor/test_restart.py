"""Issue 12 case 2 against a real supervisord: a program that supervisord's ``autorestart``
brings back after a SIGKILL keeps its room while it restarts, so a waiter is not granted memory
the restarted program is about to load into (on main the waiter, or the program, OOMs)."""

from __future__ import annotations

import os
import signal

from .conftest import PY, Prog, engine_cmd, free_port, wait_for


def test_a_program_supervisord_restarts_keeps_its_room_and_nothing_ooms(stack_factory):
    # 11 GiB for the program, 14 GiB for the waiter: together more than the card's 23.5 GiB.
    # The restarted program loads over 1.5 s, so on main the waiter is granted and loads first.
    waiter = (f"{PY} -m berth.cli run --engine waiter --size 14GiB@gpu0 --health none -- "
              f"{engine_cmd(free_port(), '13.5GiB')}")
    progs = [Prog("vllm-a", engine_cmd(free_port(), "10.5GiB") + " --load-s 1.5",
                  engine="vllm-a", autorestart="unexpected", startsecs=2),
             Prog("waiter", waiter, autostart=False)]
    s = stack_factory(progs)
    lease = wait_for(lambda: s.active("vllm-a") if s.info("vllm-a").statename == "RUNNING"
                     else None, 20, "vllm-a RUNNING with an active lease")
    first = lease["pid"]
    s.ctl("start", "waiter")
    wait_for(lambda: s.waiting("waiter"), 15, "the waiter's lease to wait")

    os.kill(first, signal.SIGKILL)          # a crash: supervisord restarts it (autorestart)

    def settled():
        """The restarted program serves under its lease, or the promise is already broken."""
        if s.oom_events() or s.active("waiter"):
            return "broken"
        info = s.info("vllm-a")
        return info.statename == "RUNNING" and info.pid != first and s.active("vllm-a", info.pid)
    wait_for(settled, 20, "vllm-a to run again under its lease")
    assert s.waiting("waiter"), "the waiter was granted the restarting program's room"
    assert s.oom_events() == 0, s.log("vllm-a.log")[-600:] + s.log("waiter.log")[-600:]
    again = s.info("vllm-a").pid
    assert s.active("vllm-a", again)["id"] == lease["id"]   # the same lease: its room was kept

    # Stopped for good: its room goes to the waiter, which loads beside nothing.
    s.ctl("stop", "vllm-a")
    wait_for(lambda: s.active("waiter"), 20, "the waiter's lease once vllm-a stopped")
    log = s.log("listener.log")
    assert "neither owns lease" not in log and "runs unleased" not in log, log
    assert s.oom_events() == 0


def test_the_listener_releases_a_lease_it_adopted(stack_factory):
    """Issue 12 case 2, the listener's own release: stopping an observed program in supervisord
    releases the lease the listener adopted for it. On main berthd refused that release every
    time ("release refused: pid N neither owns lease ... nor started its engine"), and the lease
    ended only when a read saw the PID gone."""
    s = stack_factory([Prog("vllm-a", engine_cmd(free_port(), "4GiB"), engine="vllm-a")])
    lease = wait_for(lambda: s.active("vllm-a") if s.info("vllm-a").statename == "RUNNING"
                     else None, 20, "vllm-a RUNNING with an adopted lease")
    s.ctl("stop", "vllm-a")
    wait_for(lambda: not s.leases("vllm-a"), 20, "the adopted lease ended")
    log = wait_for(lambda: (lambda t: t if f"lease {lease['id']} released" in t else None)(
        s.log("listener.log")), 10, "the listener's release accepted")
    assert "neither owns lease" not in log and "earlier listener" not in log, log
