"""``berth run`` stopped by a signal exits one code per signal in every state (core/run/main.py
step 5): 130 for SIGINT (Ctrl-C), 0 for SIGTERM (a manager's stop: llama-swap logs any other
code as "process exited with error", systemd marks the unit failed), whether it waits for its
grant, serves, or was drained. Before, a waiting run exited 143 on either signal, a serving one
with its engine's code (0 for the stub engine), and a drained one 0."""

from __future__ import annotations

import signal
import subprocess

import psutil

from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc
from tests.helpers import free_port, stop_all, wait_for


def test_sigint_and_sigterm_give_one_code_each_in_every_state(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    a = berth_run(d, "A", "--front", f"127.0.0.1:{free_port()}", "--size", "8GiB")
    b = berth_run(d, "B", "--front", f"127.0.0.1:{free_port()}", "--size", "8GiB")
    procs = [a, b, d.proc]
    try:
        wait_for(lambda: d.state_of("A") == "active" and d.state_of("B") == "active", 60,
                 "A and B granted")
        # Waiting: W's lower priority displaces no one, so it waits for its grant.
        w = berth_run(d, "W", "--size", "20GiB", "--priority", "-1")
        procs.append(w)
        wait_for(lambda: d.state_of("W") == "waiting", 60, "W waiting")
        assert stop_proc(w, signal.SIGINT) == 130
        w2 = berth_run(d, "W2", "--size", "20GiB", "--priority", "-1")
        procs.append(w2)
        wait_for(lambda: d.state_of("W2") == "waiting", 60, "W2 waiting")
        assert stop_proc(w2, signal.SIGTERM) == 0
        # Serving.
        wait_for(lambda: (d.lease_of("A") or {}).get("ready"), 60, "A serving")
        assert stop_proc(a, signal.SIGINT) == 130
        # Drained (the run and its front stay, issue 35).
        out = subprocess.run([BERTH, "drain", "B"], env=d.env, capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        wait_for(lambda: any(r["engine"] == "B" for r in d.status()["drained"]), 60,
                 "B listed as drained")
        assert b.poll() is None
        assert stop_proc(b, signal.SIGTERM) == 0
        assert "Traceback" not in (tmp_path / "run-B.log").read_text()
    finally:
        stop_all(procs, tmp_path)


def test_sighup_stops_the_run_in_order_and_exits_129(tmp_path):
    """``berth run`` in a terminal that closes gets SIGHUP, and its default action killed the run
    at once: no stop sequence, its lease left to berthd to find dead, its engine left to the
    watchdog. It stops as on SIGTERM (the engine stopped, its memory confirmed free, the lease
    released, all before it exits) and exits 129 (128 + SIGHUP), in its log by name."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    a = berth_run(d, "A", "--front", f"127.0.0.1:{free_port()}", "--size", "8GiB")
    try:
        wait_for(lambda: (d.lease_of("A") or {}).get("ready"), 60, "A serving")
        engine = psutil.Process(d.lease_of("A")["pid"])
        assert stop_proc(a, signal.SIGHUP, timeout=60) == 129
        # in order: both were done before the run exited, so neither is waited for here
        assert d.lease_of("A") is None, d.status()["leases"]
        assert not engine.is_running() or engine.status() == psutil.STATUS_ZOMBIE
        log = (tmp_path / "run-A.log").read_text()
        assert "the run exits 129 (stopped by SIGHUP)" in log, log
        assert "Traceback" not in log, log
    finally:
        stop_all([a, d.proc], tmp_path)
