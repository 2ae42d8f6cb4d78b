"""One live run per engine name (owners.py rule 4). Two ``berth run``s of one name made berthd's
log and ``berth status`` ambiguous (two leases "A", lines that could be either); now berthd
refuses the second with a 409 that names the name and the holder's PID, and the second run
exits 1 saying so in its flags' words. A run that died leaves its name free at once."""

from __future__ import annotations

import os
import signal

from tests.berthd import Berthd, berth_run, sim_config
from tests.helpers import free_port, stop_all, wait_for


def test_a_second_live_run_of_one_name_is_refused_naming_the_holder(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    first = berth_run(d, "A", "--front", f"127.0.0.1:{free_port()}", "--size", "4GiB")
    procs = [first, d.proc]
    try:
        wait_for(lambda: d.state_of("A") == "active", 60, "the first A granted")
        second = berth_run(d, "A", "--size", "4GiB", log=tmp_path / "run-A2.log")
        procs.append(second)
        assert second.wait(60) == 1
        said = (tmp_path / "run-A2.log").read_text()
        assert f"--engine: 'A' is already run by pid {first.pid}" in said, said
        assert "another --engine name" in said and "Traceback" not in said, said
        assert [le["engine"] for le in d.status()["leases"]] == ["A"]
        assert first.poll() is None
        # berthd's own answer: a 409 with the holder's PID as a field.
        code, body = d.call("POST", "/v1/leases", {"engine": "A", "shares": [{"size": "1GiB"}]})
        assert code == 409 and body["error"]["holder_pid"] == first.pid, (code, body)
    finally:
        stop_all(procs, tmp_path)


def test_a_dead_runs_name_is_free_at_once(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    first = berth_run(d, "A", "--size", "4GiB")
    procs = [first, d.proc]
    try:
        wait_for(lambda: d.state_of("A") == "active", 60, "the first A granted")
        old = d.lease_of("A")["id"]
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        again = berth_run(d, "A", "--size", "4GiB", log=tmp_path / "run-A2.log")
        procs.append(again)
        def second_granted():
            # One read of the board: between two, the dead run's lease could leave.
            le = d.lease_of("A")
            return le is not None and le["id"] != old and \
                all(sh["state"] == "active" for sh in le["shares"])
        wait_for(second_granted, 60, "the second A granted")
        assert "refused" not in (tmp_path / "run-A2.log").read_text()
    finally:
        stop_all(procs, tmp_path)
