"""Every 503 and every wait names what holds the memory (issue 37 "A culprit half named"): a
stowaway by its PID, program, user and bytes, with advice whose command works; a holder by its
engine and its lease."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

from tests.berthd import wait_for
from tests.broker.conftest import Chat, GiB, engine_run, free_port, run_log

CHARGE = str(Path(sys.executable).parent / "berth-sim-charge")


def test_a_stowaway_is_named_by_pid_program_and_user(berthd, runs):
    d = berthd(policy={"wait_limit": "60s"})
    env = {k: v for k, v in d.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    stow = subprocess.Popen([CHARGE, "--size", "20GiB", "--", "sleep", "600"], env=env,
                            start_new_session=True)
    runs.append(stow)
    # berth-sim-charge allocates, then execs sleep: a read between the two sees the charge.
    wait_for(lambda: any(s["pid"] == stow.pid and s.get("program") == "sleep 600"
                         for s in d.status()["cards"][0]["stowaways"]), 30,
             "the stowaway on the board with its program")
    st = d.status()["cards"][0]["stowaways"][0]
    assert (st["pid"], st["program"], st["user"], st["bytes"]) == \
        (stow.pid, "sleep 600", getpass.getuser(), 20 * GiB)
    port = free_port()
    engine_run(d, runs, "ten", size="10GiB", weights="9GiB", front=port)
    wait_for(lambda: d.status()["waiting"], 60, "ten waiting")
    c = Chat(port, timeout_s=90)()
    assert c.status == 503, c.body
    msg = c.body["error"]["message"]
    assert f"stowaway pid {stow.pid} (sleep 600, user {getpass.getuser()}) holds 20.0GiB" in msg, \
        msg
    assert f"kill {stow.pid}" in msg, msg
    # The wait says the same: the board's reason and the run's log.
    why = d.status()["waiting"][0]["why"]
    assert "sleep 600" in why and str(stow.pid) in why, why
    wait_for(lambda: "sleep 600" in run_log(d, "ten"), 30, "the run's log naming the stowaway")
    board = subprocess.run([sys.executable, "-m", "berth.cli", "status"], env=d.env,
                           capture_output=True, text=True, timeout=60)
    assert f"pid {stow.pid} sleep 600 (user {getpass.getuser()}) 20.0GiB" in board.stdout, \
        board.stdout
    os.killpg(stow.pid, 9)


def test_a_stowaway_that_execs_another_program_is_named_by_the_new_one(berthd, runs):
    """A launcher that allocates and then execs its program keeps its PID (a wrapper script,
    berth-sim-charge): the board names the program it runs now, not the launcher it saw first."""
    d = berthd()
    env = {k: v for k, v in d.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    stow = subprocess.Popen([CHARGE, "--size", "4GiB", "--", "sh", "-c", "read go; exec sleep 600"],
                            env=env, stdin=subprocess.PIPE, start_new_session=True)
    runs.append(stow)

    def program() -> str | None:
        found = [s for s in d.status()["cards"][0]["stowaways"] if s["pid"] == stow.pid]
        return found[0].get("program") if found else None
    wait_for(lambda: (program() or "").startswith("sh -c"), 30, "the launcher on the board")
    stow.stdin.write(b"go\n")
    stow.stdin.close()
    wait_for(lambda: program() == "sleep 600", 30, "the board naming the program it execs")


def test_a_holder_is_named_by_engine_and_lease(berthd, runs):
    d = berthd(policy={"wait_limit": "60s"})
    engine_run(d, runs, "boss", priority=5)
    wait_for(lambda: (d.lease_of("boss") or {}).get("ready"), 60, "boss serving")
    lease = d.lease_of("boss")["id"]
    port = free_port()
    engine_run(d, runs, "minion", priority=0, front=port)
    wait_for(lambda: d.status()["waiting"], 60, "minion waiting")
    c = Chat(port, timeout_s=90)()
    assert c.status == 503, c.body
    assert "boss (priority 5" in c.body["error"]["message"]
    assert f"in lease {lease}" in c.body["error"]["message"], c.body


def test_parking_an_in_process_host_that_cannot_park_advises_no_drain(berthd):
    """The old advice, "`berth drain comfyui` stops it instead", named a command that does not
    stop an in-process host (rule 6): the advice is now what frees its memory."""
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "comfyui", "drain": False,
                                            "no_park": "it runs with --gpu-only",
                                            "shares": [{"card": "gpu0", "size": "2GiB"}]})
    assert code == 201, r
    wait_for(lambda: d.state_of("comfyui") == "active", 30, "comfyui granted")
    code, r = d.call("POST", "/v1/operator/park", {"target": "comfyui"})
    msg = r["error"]["message"] if "error" in r else str(r)
    assert code == 409 or code == 400, (code, r)
    assert "berth drain comfyui" not in msg and "stops it instead" not in msg, msg
    assert "it runs with --gpu-only" in msg and "restart comfyui" in msg, msg
