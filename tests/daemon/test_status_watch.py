"""Watching berthd: ``berth status --watch [SECONDS]``, and when each holder's protection ends
(its minimum turn, its ``keep_warm``), as ``ollama ps`` says "until" (issue 29)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time

import pytest
from berth.daemon.status import protection
from berth.decide.admission import Policy
from berth.decide.model import Lease, Share, ShareState
from berth.decide.turns import displaceable

from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc, wait_for

GiB = 1 << 30
PCI = "0000:01:00.0"


def _holder(priority: int = 0, in_flight: int = 1) -> Lease:
    le = Lease("h", "holder", {PCI: Share(PCI, 4 * GiB, state=ShareState.ACTIVE)},
               priority=priority, granted_at=100.0, ready_at=110.0, last_used_at=150.0,
               keep_warm_s=120.0, switch_cost_s=3.0, jobs_reported=True, in_flight=in_flight)
    return le


@pytest.mark.parametrize("min_turn_s,max_turn_s,reported", [
    (30.0, 30.0, True), (1.0, 30.0, True), (1.0, 30.0, False), (40.0, 5.0, True),
    (1.0, 2.0, True)])
def test_the_turn_ends_where_the_ladder_stops_keeping_it(min_turn_s, max_turn_s, reported):
    """A busy holder against an equal-priority waiter: protected until ``turn_until``, not
    after. The turn is at least the holder's switch cost (3 s) and its minimum turn, and, while
    its front reports its jobs, up to ``max_turn`` (rent or buy: a busy holder serves its turn)."""
    policy = Policy(min_turn_s=min_turn_s, max_turn_s=max_turn_s, juggle_window_s=0)
    h, w = _holder(), Lease("w", "waiter", {PCI: Share(PCI, GiB)})
    h.jobs_reported = reported
    now = 111.0
    p = protection(h, policy, now, wall=1_000.0)
    end = now + p["turn_left_s"]
    turn = max(min_turn_s, 3.0, max_turn_s if reported else 0.0)
    assert end == pytest.approx(110.0 + turn)
    assert p["turn_until"] == pytest.approx(1_000.0 + p["turn_left_s"])
    assert displaceable(h, w, policy, end - 0.01) is not None
    assert displaceable(h, w, policy, end + 0.01) is None
    assert protection(h, policy, end + 0.01, 0.0)["turn_until"] is None


@pytest.mark.parametrize("idle_for_s,parked_cost_s", [(0.0, 2.0), (1.0, 0.5), (0.0, 40.0)])
def test_an_idle_holders_turn_ends_where_its_rent_does(idle_for_s, parked_cost_s):
    """An idle holder keeps its card while idle for less than a switch back would cost (its
    restore, 3 s, plus a park), never past its longest turn; the first-request window after it
    became ready is over (it served a job)."""
    policy = Policy(juggle_window_s=0)
    h, w = _holder(in_flight=0), Lease("w", "waiter", {PCI: Share(PCI, GiB)})
    now = 120.0
    h.park_cost_s, h.last_job_at, h.idle_since = parked_cost_s, 115.0, now - idle_for_s
    p = protection(h, policy, now, wall=0.0)
    end = now + p["turn_left_s"]
    assert end == pytest.approx(min(h.idle_since + 3.0 + parked_cost_s, 110.0 + policy.max_turn_s))
    assert displaceable(h, w, policy, end - 0.01) is not None
    assert displaceable(h, w, policy, end + 0.01) is None


def test_keep_warm_ends_where_the_ladder_stops_keeping_an_idle_higher_priority():
    policy = Policy(min_turn_s=0, juggle_window_s=0)
    h, w = _holder(priority=5, in_flight=0), Lease("w", "waiter", {PCI: Share(PCI, GiB)})
    p = protection(h, policy, 160.0, wall=0.0)
    assert p["idle"] and p["keep_warm_left_s"] == pytest.approx(110.0)
    end = 160.0 + p["keep_warm_left_s"]
    assert "higher priority" in (displaceable(h, w, policy, end - 0.01) or "")
    assert displaceable(h, w, policy, end + 0.01) is None
    assert protection(h, policy, end + 0.01, 0.0)["keep_warm_until"] is None


def test_a_parked_holder_has_no_protection():
    h = _holder()
    h.shares[PCI].state = ShareState.PARKED
    p = protection(h, Policy(), 111.0, 0.0)
    assert p["turn_until"] is None and p["keep_warm_until"] is None


@pytest.fixture
def serving(tmp_path):
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")], policy={"min_turn": "300s"})
    d = Berthd(tmp_path, cfg).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = berth_run(d, "llm", "--size", "4GiB", "--front", f"127.0.0.1:{port}")
    try:
        wait_for(lambda: (d.lease_of("llm") or {}).get("ready"), 30, "llm serving")
        yield d
    finally:
        stop_proc(run)
        d.stop()


def test_status_json_says_when_the_turn_and_keep_warm_end(serving):
    d = serving
    # A holder is idle once its front has reported no requests (not before its first report).
    # Idle: its minimum turn (300 s) keeps nothing; only the first-request window and its rent
    # (a switch back's cost) do, and both end within seconds.
    wait_for(lambda: d.lease_of("llm")["idle"] and d.lease_of("llm")["turn_left_s"] is None,
             30, "llm's front to report it idle, its first-request window and rent over")
    le = d.lease_of("llm")
    assert 250 < le["keep_warm_left_s"] <= 300, le         # keep_warm's default: 5 minutes
    out = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                         timeout=30).stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("llm"))
    assert "keep_warm until" in line, out
    assert le["idle"] and "turn until" not in line, out      # idle: the turn protects nothing
    # Serving a request: the turn keeps the card, and says until when.
    front = d.lease_of("llm")["capabilities"]["front"] or ""
    host, port = front.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({
            "model": "stub", "stream": True, "max_tokens": 20000,
            "messages": [{"role": "user", "content": "a long answer"}]}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        wait_for(lambda: not d.lease_of("llm")["idle"], 30, "llm busy")
        t0, le = time.time(), d.lease_of("llm")
        assert 250 < le["turn_left_s"] <= 300, le          # its minimum turn, from its start
        assert abs(le["turn_until"] - (t0 + le["turn_left_s"])) < 30, (t0, le)
        out = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                             timeout=30).stdout
    finally:
        conn.close()
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("llm"))
    assert "turn until" in line and "keep_warm until" in line, (out, d.lease_of("llm"))


def _watch_twice(d: Berthd, sig: int, board_starts=lambda line: "since start:" in line,
                 **popen) -> tuple[int, list[str], str]:
    """``berth status --watch 0.2`` until it printed two boards (a line where ``board_starts``
    holds, twice), then ``sig`` to its group: its exit status, the lines seen, its stderr."""
    p = subprocess.Popen([BERTH, "status", "--watch", "0.2"], env=d.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **popen)
    seen: list[str] = []
    try:
        def twice():
            seen.append(p.stdout.readline())
            return sum(board_starts(s) for s in seen) >= 2
        wait_for(twice, 30, "two boards from berth status --watch", every_s=0)
        os.killpg(p.pid, sig)
        _out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    return p.returncode, seen, err


def test_status_watch_prints_at_least_twice(serving):
    d = serving
    code, seen, err = _watch_twice(d, signal.SIGINT)          # Ctrl-C ends the watch
    assert code == 0 and "Traceback" not in err, (code, err)
    assert sum("llm" in s for s in seen) >= 2
    # As JSON: one document a line.
    p = subprocess.Popen([BERTH, "status", "--watch", "0.2", "--json"], env=d.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        docs = [json.loads(p.stdout.readline()) for _ in range(2)]
    finally:
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=20)
    assert all(doc["leases"][0]["engine"] == "llm" for doc in docs)


def test_watch_takes_seconds_and_says_what_is_wrong(serving):
    for bad in ("0", "-1", "soon"):
        r = subprocess.run([BERTH, "status", "--watch", bad], env=serving.env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "--watch" in r.stderr and bad in r.stderr, r.stderr
        # "between 0 and 3600" read as if 0 were taken (it never is: it would be a busy loop)
        assert "more than 0 and at most 3600" in r.stderr, r.stderr


def test_an_idle_holder_whose_client_waits_on_the_waiter_says_it_yields_at_once():
    """Issue 34: the board and ``berth status`` say why an idle holder yields or keeps its
    card; with the waiter known, its turn's "until" follows the forecast (none here: its last
    answer went to the client now waiting on the waiter)."""
    from berth.board_text import _until
    from berth.daemon.status import outlook
    policy = Policy(juggle_window_s=0)
    h = _holder(in_flight=0)
    h.last_job_at, h.idle_since = 115.0, 119.0
    h.demand.answered_client, h.demand.answered_at = "k1", 119.0
    w = Lease("w", "waiter", {PCI: Share(PCI, GiB)})
    w.demand.asked_client, w.demand.asked_at = "k1", 119.2
    out = outlook(h, policy, w)
    assert out["outlook"] == "none" and out["why"] == \
        "holder yields at once: its client is waiting on waiter", out
    assert protection(h, policy, 120.0, 0.0, w)["turn_until"] is None
    assert displaceable(h, w, policy, 120.0) is None
    line = _until({"demand": out, **protection(h, policy, 120.0, 0.0, w)})
    assert "holder yields at once: its client is waiting on waiter" in line, line
    # Another client's request, older than any the holder may get, its minimum turn over:
    # it yields at once, and says why.
    w.demand.asked_client = "k2"
    out = outlook(h, policy, w, 120.0)
    assert out["outlook"] == "unknown" and out["why"] == \
        "holder yields at once: waiter's request is older than any request it may get", out
    assert protection(h, policy, 120.0, 0.0, w)["turn_until"] is None
    # With no time known for the waiter's request: the plain rent, said as such, and its end.
    w.demand.asked_at = None
    out = outlook(h, policy, w, 120.0)
    assert out["outlook"] == "unknown" and "less than a switch back" in out["why"], out
    assert protection(h, policy, 120.0, 0.0, w)["turn_left_s"] == pytest.approx(2.0)
    assert outlook(_holder(in_flight=1), policy, w) is None      # serving: no forecast


def test_a_drained_runs_line_separates_its_front():
    """``berth status`` printed ``B  drained 1.32s ago front 127.0.0.1:5800`` (and ``..., 1
    request(s) waiting front ...``): the front ran into the words before it."""
    from berth.board_text import _drained_lines
    run = {"engine": "B", "front": "127.0.0.1:5800", "waiters": 0, "why": "room for A",
           "drained_s": 1.32, "asking": False, "move_to": None}
    assert _drained_lines([run])[1].split("B", 1)[1].strip() == \
        "drained 1.32s ago, front 127.0.0.1:5800"
    assert _drained_lines([{**run, "waiters": 1}])[1].endswith(
        "ago, 1 request(s) waiting, front 127.0.0.1:5800")


# The cases share one idle berthd (issue 38), on one worker: the signal goes to the watch alone.
@pytest.mark.xdist_group("status_watch_signals")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_sighup_ends_the_watch_as_ctrl_c_and_sigterm_do(shared_berthd, sig):
    """The watch's terminal closed (SIGHUP): it died of it (the default action), exit -1. It
    ends as on Ctrl-C or SIGTERM: exit 0, no traceback."""
    code, _seen, err = _watch_twice(
        shared_berthd(), sig, lambda line: line.startswith("--- "),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert code == 0 and "Traceback" not in err, (code, err)
