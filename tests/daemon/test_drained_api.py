"""Issue 35: ``PUT`` / ``DELETE /v1/drained/{engine}``, the note a drained run leaves on the board:
a malformed call is a 400 naming the field and value; an entry whose run is gone is dropped."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.berthd import Berthd, sim_config


def test_drained_entries_are_checked_listed_and_dropped_with_their_run(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    try:
        code, body = d.call("PUT", "/v1/drained/B", {"holding": -1})
        assert code == 400 and "holding" in body["error"]["message"], body
        code, body = d.call("PUT", "/v1/drained/B", {"holding": 0, "colour": "red"})
        assert code == 400 and "colour" in body["error"]["message"], body
        code, body = d.call("PUT", "/v1/drained/B", {"owner_pid": 1})
        assert code == 400 and "owner_pid" in body["error"]["message"], body
        code, body = d.call("PUT", "/v1/drained/a%20b", {})
        assert code == 400 and "engine" in body["error"]["message"], body

        # A run (here a child of this test) puts its entry, then dies: berthd drops it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            code, body = d.call("PUT", "/v1/drained/B", {"holding": 2, "why": "room for W",
                                                         "owner_pid": child.pid})
            assert code == 200, body
            [entry] = d.status()["drained"]
            assert (entry["engine"], entry["waiters"], entry["why"], entry["pid"]) == \
                ("B", 2, "room for W", child.pid)
        finally:
            child.kill()
            child.wait()
        assert d.status()["drained"] == []

        assert d.call("PUT", "/v1/drained/C", {"holding": 0})[0] == 200
        assert d.call("DELETE", "/v1/drained/C")[1] == {"engine": "C", "removed": True}
        assert d.call("DELETE", "/v1/drained/C")[1] == {"engine": "C", "removed": False}
    finally:
        d.stop()


def test_an_operator_action_on_a_drained_engine_says_it_is_drained(tmp_path):
    """``berth park B`` on an engine whose run is drained (no lease, its front waiting) said
    ``no lease or engine named 'B'`` while ``berth status`` listed B as drained: the answer is a
    409 that says B is drained and what starts it again. ``berth wake B`` asks B's run to ask
    for its card again: its long-poll of ``GET /v1/drained/B/wake`` answers ``wake`` until the
    run says it asks."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    entry = {"front": "127.0.0.1:5801", "holding": 0, "why": "room for W",
             "owner_pid": child.pid}
    try:
        code, body = d.call("PUT", "/v1/drained/B", entry)
        assert code == 200 and body["wake"] is False, body
        for op in ("park", "drain", "hold", "release-hold"):
            code, body = d.call("POST", f"/v1/operator/{op}", {"target": "B"})
            text = body["error"]["message"]
            assert code == 409 and "B is drained" in text and "127.0.0.1:5801" in text, body
            assert "next request" in text and "berth wake B" in text and op in text, body
        code, body = d.call("POST", "/v1/operator/park", {"target": "nosuch"})
        assert code == 404 and body["error"]["message"] == "no lease or engine named 'nosuch'"
        code, body = d.call("POST", "/v1/operator/wake", {"target": "nosuch"})
        assert code == 404, body

        assert d.call("GET", "/v1/drained/B/wake?timeout=0")[1] == {"engine": "B", "wake": False}
        code, body = d.call("POST", "/v1/operator/wake", {"target": "B"})
        assert code == 200 and body["lease"] is None and body["drained"] is True, body
        assert body["notes"] == ["its run asks for its card again; it starts when granted"]
        # Answered at once (a long timeout would not be waited for), and again until heard.
        for _ in range(2):
            assert d.call("GET", "/v1/drained/B/wake?timeout=600")[1]["wake"] is True
        assert d.call("PUT", "/v1/drained/B", entry)[1]["wake"] is True
        assert d.call("PUT", "/v1/drained/B", {**entry, "asking": True})[1]["wake"] is False
        assert d.call("GET", "/v1/drained/B/wake?timeout=0")[1]["wake"] is False
        code, body = d.call("POST", "/v1/operator/wake", {"target": "B"})
        assert code == 200 and "already" in body["notes"][0], body
        code, body = d.call("GET", "/v1/drained/B/wake?timeout=-1")
        assert code == 400 and "timeout" in body["error"]["message"], body
    finally:
        child.kill()
        child.wait()
        d.stop()


def test_berth_size_of_a_drained_engine_says_it_is_drained(tmp_path):
    """``berth size B`` of a drained B said ``no lease or engine 'B' (engines now: none)`` while
    ``berth status`` listed B as drained."""
    from tests.berthd import BERTH
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        code, body = d.call("PUT", "/v1/drained/B", {"front": "127.0.0.1:5801",
                                                     "owner_pid": child.pid})
        assert code == 200, body
        r = subprocess.run([BERTH, "size", "B"], env=d.env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "B is drained" in r.stderr, r.stderr
        assert "no lease or engine" not in r.stderr, r.stderr
    finally:
        child.kill()
        child.wait()
        d.stop()


def test_a_restarted_berthd_keeps_when_the_drain_happened(tmp_path):
    """After a berthd restart the run puts its entry again, and ``berth status`` said
    ``coder drained 2.54s ago`` for a drain 90 s old: the run sends when its drain happened
    (``since``, seconds since the epoch) and berthd keeps it, never later than its own now."""
    config = sim_config(tmp_path, [("gpu0", "24GiB")])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    drained_at = time.time() - 90.0
    body = {"front": "127.0.0.1:5801", "holding": 0, "why": "room for W",
            "owner_pid": child.pid, "since": drained_at}
    try:
        for _ in range(2):                      # the second berthd is the restarted one
            d = Berthd(tmp_path, config).start()
            try:
                code, answer = d.call("PUT", "/v1/drained/B", body)
                assert code == 200 and answer["since"] == drained_at, answer
                [entry] = d.status()["drained"]
                assert entry["drained_s"] >= 89.0, entry
            finally:
                d.stop()
        d = Berthd(tmp_path, config).start()
        try:
            for bad in (-1, "soon"):
                code, answer = d.call("PUT", "/v1/drained/C", {"since": bad})
                assert code == 400 and "since" in answer["error"]["message"], answer
            future = time.time() + 3600
            code, answer = d.call("PUT", "/v1/drained/C", {"since": future})
            assert code == 200 and answer["since"] <= time.time(), answer
        finally:
            d.stop()
    finally:
        child.kill()
        child.wait()
