"""Issue 12 case 7: smaller defects seen on the way, each with its test. How each failed on main
before its fix is said in the test's docstring."""

from __future__ import annotations

import signal
import urllib.parse

from tests.berthd import wait_for
from tests.broker.conftest import Chat, GiB, engine_run, free_port, run_log, serving

_HOOK = ("--park", "hook", "--adapter", "protocol")


def _entries(d, kind: str, engine: str) -> list[dict]:
    return [e for e in d.timeline() if e["kind"] == kind and e.get("engine") == engine]


def test_a_grant_after_a_fallback_says_drain(berthd, runs):
    """Main: B's grant was labelled "(park)" though A's park fell back to a drain."""
    d = berthd(policy={"release_grace": "1s", "ram_budget": "64GiB"})
    engine_run(d, runs, "A", front=free_port(), run_args=_HOOK,
               engine_args=("--protocol", "--park-noop"))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    engine_run(d, runs, "B")
    wait_for(lambda: serving(d, "B"), 60, "B granted after A's fallback")
    grant = _entries(d, "grant", "B")[-1]
    assert grant["data"]["rung"] == "drain" and "(drain)" in grant["text"], grant
    assert d.status()["counters"]["fallbacks_to_drain"] == 1


def test_a_wake_that_does_not_answer_counts_as_a_fallback(berthd, runs):
    """Main: ``fallbacks_to_drain`` stayed 0 after a wake that did not answer stopped the
    engine."""
    d = berthd(policy={"wake_limit": "1s", "ram_budget": "64GiB"})
    port = free_port()
    engine_run(d, runs, "A", front=port, run_args=_HOOK, engine_args=("--protocol", "--wake-hang"))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    assert d.call("POST", "/v1/operator/park", {"target": "A"})[0] == 200
    wait_for(lambda: d.state_of("A") == "parked", 30, "A parked")
    Chat(port, timeout_s=60)()
    wait_for(lambda: _entries(d, "drain", "A"), 30, "A stopped after its wake hung")
    assert d.status()["counters"]["fallbacks_to_drain"] == 1


def test_a_release_being_confirmed_is_the_reason(berthd, holders, tmp_path):
    """Main: while A's memory was still being confirmed free, B's reason read "no holder can
    make room"."""
    # An 8 s free delay: the window in which A's release is being confirmed, and B's reason
    # read (within 5 s of its request).
    d = berthd(free_delay="8s")
    eng = holders()
    code, r = d.call("POST", "/v1/leases", {"engine": "A", "shares": [{"size": "14GiB"}]})
    assert code == 201 and r["state"] == "active", r
    assert d.call("POST", f"/v1/leases/{r['id']}/attach", {"pid": eng.pid})[0] == 200
    assert eng.alloc(14 * GiB)
    wait_for(lambda: d.lease_of("A")["shares"][0]["used_bytes"] == 14 * GiB, 30, "A's use read")
    eng.kill()
    wait_for(lambda: d.state_of("A") == "released", 30, "A released")
    code, rb = d.call("POST", "/v1/leases", {"engine": "B", "shares": [{"size": "14GiB"}]})
    why = wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 5, "B's reason")
    assert "no holder can make room" not in why and "A" in why and "confirmed free" in why, why
    code, g = d.call("GET", f"/v1/leases/{rb['id']}/grant?timeout=30", timeout=60)
    assert g["granted"], g


def test_an_exit_is_logged_once(berthd, holders):
    """Main: "exit A exited" was logged two or three times for one exit: once for the run's
    drain report, again for its release, again when the reader saw the process gone, whenever
    the driver had not yet shown the memory free."""
    d = berthd()
    eng = holders()
    code, r = d.call("POST", "/v1/leases", {"engine": "A", "shares": [{"size": "14GiB"}]})
    lid = r["id"]
    assert d.call("POST", f"/v1/leases/{lid}/attach", {"pid": eng.pid})[0] == 200
    assert eng.alloc(14 * GiB)
    wait_for(lambda: d.lease_of("A")["shares"][0]["used_bytes"] == 14 * GiB, 30, "A's use read")
    assert d.call("POST", f"/v1/leases/{lid}/report", {"op": "drain", "ok": True})[0] == 200
    assert d.call("POST", f"/v1/leases/{lid}/release", {"reason": "engine exited"})[0] == 200
    eng.kill()
    wait_for(lambda: d.lease_of("A") is None, 30, "A's lease ended")
    assert len(_entries(d, "exit", "A")) == 1, _entries(d, "exit", "A")


def test_a_lease_id_keeps_a_non_ascii_name(berthd):
    """Main: engine "模型-🚀" got lease id "-----09233-1"."""
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "模型-🚀", "shares": [{"size": "1GiB"}]})
    assert code == 201, r
    assert r["id"].startswith("模型-"), r["id"]
    code, le = d.call("GET", "/v1/leases/" + urllib.parse.quote(r["id"]))
    assert code == 200 and le["engine"] == "模型-🚀", le


def test_counters_since_start_start_at_zero(berthd):
    """Main: the counters the board calls "since start" survived a berthd restart."""
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "A", "shares": [{"size": "1GiB"}]})
    assert d.status()["counters"]["grants"] == 1
    d.stop()
    d.start()
    assert d.status()["counters"]["grants"] == 0


def test_a_full_lease_is_not_over_it(berthd, holders):
    """Main: an engine using its 14 GiB lease plus a KV block (2 MiB) was shown "over its
    lease"; the scheduler itself allows a 64 MiB slack before it says so."""
    d = berthd()
    eng = holders()
    code, r = d.call("POST", "/v1/leases", {"engine": "A", "shares": [{"size": "14GiB"}]})
    assert d.call("POST", f"/v1/leases/{r['id']}/attach", {"pid": eng.pid})[0] == 200
    assert eng.alloc(14 * GiB + (2 << 20))
    wait_for(lambda: (d.lease_of("A")["shares"][0]["used_bytes"] or 0) > 14 * GiB, 30,
             "use read")
    share = d.status()["cards"][0]["shares"][0]
    assert share["over_bytes"] == 0, share
    assert not [e for e in d.timeline() if e["kind"] == "over_lease"]


def test_a_plain_stop_is_not_logged_as_a_park(berthd, runs):
    """Main: a stop signal to ``berth run`` logged "front A: open -> closing (a park, checkpoint
    or lend begins ...)"."""
    d = berthd()
    p = engine_run(d, runs, "A", front=free_port())
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    log = run_log(d, "A")
    closing = [ln for ln in log.splitlines() if "open -> closing" in ln]
    assert closing and all("park" not in ln and "stop" in ln for ln in closing), closing
