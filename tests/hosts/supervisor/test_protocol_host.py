"""The supervisord host against a real supervisord: a program with a non-ASCII name (``len``
counts characters), a listener whose own code prints to stdout, and children left holding
memory after supervisord stopped their program (issue 7 acceptance)."""

from __future__ import annotations

import os
import signal

import psutil

from tests.helpers import wait_for

from .conftest import Prog, engine_cmd, free_port

NAME = "modèle-ü"


def test_non_ascii_stray_stdout_orphans(stack_factory):
    progs = [Prog(NAME, engine_cmd(free_port(), "2GiB"), engine=NAME, size="3GiB"),
             # A shell wrapper without exec: supervisord's stop reaches the shell only.
             Prog("orphan", f"bash -c '{engine_cmd(free_port(), '2GiB')} & wait'",
                  engine="orphan", size="3GiB")]
    s = stack_factory(progs, listener_cmd="{py} -m tests.hosts.supervisor.noisy_listener "
                                          "--config {config}")
    listener_pid = s.info("berth").pid

    # The non-ASCII program is leased; its events (payloads with multi-byte characters) parse.
    info = s.info(NAME)
    wait_for(lambda: s.active(NAME, info.pid), 20, f"an active lease for {NAME}")
    wait_for(lambda: f"PROCESS_STATE_RUNNING {NAME}" in s.log("listener.log"), 20,
             "the listener to log the non-ASCII program's RUNNING event")

    # The orphan program: its shell is leased, the engine it started holds memory.
    sh = s.info("orphan")
    lease = wait_for(lambda: (x := s.active("orphan", sh.pid)) and x["shares"][0]["used_bytes"]
                     and x, 40, "the orphan program's lease to see its child's memory")
    child = [p.pid for p in psutil.Process(sh.pid).children()]
    assert len(child) == 1, child
    s.berth("drain", "orphan")
    wait_for(lambda: "STOPPED" in s.ctl("status", "orphan"), 30, "supervisorctl: orphan STOPPED")
    assert psutil.pid_exists(child[0])                  # supervisord signalled the shell only
    le = wait_for(lambda: next((x for x in s.leases("orphan") if x.get("orphans")), None), 30,
                  "the board to list the orphan's child")
    assert le["id"] == lease["id"] and le["shares"][0]["state"] == "released"
    assert [o["pid"] for o in le["orphans"]] == child and le["orphans"][0]["bytes"] > 0
    assert "stopasgroup=true" in le["note"] and "[program:orphan]" in le["note"]
    board = s.berth("status").stdout
    assert "killasgroup=true" in board and str(child[0]) in board, board
    os.kill(child[0], signal.SIGTERM)                   # the operator cleans up, not Berth
    wait_for(lambda: not s.leases("orphan"), 30, "the orphan's lease to end once freed")

    # The listener printed to stdout on every event and still follows the protocol.
    s.ctl("stop", NAME)
    wait_for(lambda: not s.leases(NAME), 15, f"{NAME}'s lease to end after its stop")
    wait_for(lambda: f"PROCESS_STATE_STOPPED {NAME}" in s.log("listener.log"), 20,
             "the listener to process the STOPPED event")
    log = s.log("listener.log")
    assert "stray print about PROCESS_STATE" in log and "stray write just before RESULT" in log
    sup = s.log("supervisord.log")
    assert "UNKNOWN" not in sup and "bad result line" not in sup
    assert "berth: BUSY -> ACKNOWLEDGED" in sup
    assert s.info("berth").pid == listener_pid           # never restarted: no desync
