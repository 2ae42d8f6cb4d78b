"""A request held while berthd is down says so (found by a new user): the run waits for berthd
(its engine fits nowhere unleased) and its log says why, but the held request's 503 said only
"was not ready within the client's deadline (state starting)", with no reason at all."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.berthd import Berthd, berth_run, sim_config
from tests.helpers import free_port, stop_all, wait_for


def test_a_request_held_while_berthd_is_down_names_berthd(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    pw, pb = free_port(), free_port()
    w = berth_run(d, "W", "--front", f"127.0.0.1:{pw}", "--size", "20GiB", weights="19GiB")
    procs = [w, d.proc]
    try:
        wait_for(lambda: (d.lease_of("W") or {}).get("ready"), 60, "W serving")
        d.stop()
        log = tmp_path / "run-B.log"
        b = berth_run(d, "B", "--front", f"127.0.0.1:{pb}", "--size", "14GiB", weights="13GiB",
                      log=log)
        procs.append(b)
        wait_for(lambda: log.exists() and "Waiting for berthd" in log.read_text(), 60,
                 "B's run waiting for berthd")
        body = json.dumps({"model": "B", "messages": [{"role": "user", "content": "hi"}]})
        req = urllib.request.Request(f"http://127.0.0.1:{pb}/v1/chat/completions",
                                     data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "X-Berth-Deadline": "2"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("a 503 was expected")
        except urllib.error.HTTPError as e:
            assert e.code == 503
            message = json.loads(e.read())["error"]["message"]
        assert "berthd is not reachable" in message, message
    finally:
        stop_all(procs, tmp_path)
