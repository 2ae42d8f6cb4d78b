"""Issue 24, live: a fresh engine that has served its first request is not kept for one.

A holder that has just become ready keeps its card up to ``first_request_s`` for its first
request (a manager's health poll). The run's reporter samples the front's in-flight count every
50 ms, so a request a small model answers in a few ms was never seen: berthd held the card the
whole ``first_request_s`` after the answer (seen with the real llama-swap: B answered at 1.28 s
and was drained at 2.67 s). The front now counts the model requests it starts, the run reports
the count with its samples, and berthd ends the hold at the first one served.

Here ``first_request`` is 60 s, so a hold that runs its course cannot hide inside the test's
deadlines; B's rent after its request is its own start (seconds), far shorter. Seen before the
fix: A was not granted within 45 s of B's answer (the hold ran to B's ready + 60 s), and when a
sample happened to catch the request, the timeline had no ``first_request`` note.
"""

from __future__ import annotations

import os

from tests.berthd import wait_for
from tests.broker.conftest import Chat, engine_run, free_port, serving

FIRST_REQUEST_S = 60.0


def _entry(tl: list[dict], engine: str, kind: str) -> dict:
    found = [e for e in tl if e["engine"] == engine and e["kind"] == kind]
    assert found, (engine, kind, [(e["engine"], e["kind"]) for e in tl])
    return found[0]


def test_a_request_answered_between_samples_ends_the_first_request_hold(berthd, runs):
    d = berthd(policy={"first_request": f"{FIRST_REQUEST_S:g}s"})
    port = free_port()
    # No park: B is drained for A. A fast stub (no KV cache to grow on the card): one token
    # answered in a few ms.
    engine_run(d, runs, "B", front=port, tokens_per_s=100000.0,
               engine_args=("--kv-per-token", "0"))
    wait_for(lambda: serving(d, "B"), 60, "B serving")
    engine_run(d, runs, "A")
    why = wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 30, "A waiting")
    assert "B" in why and "first request" in why, why
    chat = Chat(port, max_tokens=1)()
    assert chat.status == 200, (chat.status, chat.body, chat.error)
    # The deadline bounds a failure: the old hold ended 60 s after B's ready.
    wait_for(lambda: d.state_of("A") == "active", 45, "A granted once B served its request")
    tl = d.timeline()
    ready, first = _entry(tl, "B", "ready"), _entry(tl, "B", "first_request")
    drain, grant = _entry(tl, "B", "drain"), _entry(tl, "A", "grant")
    assert ready["seq"] < first["seq"] < drain["seq"] < grant["seq"], (ready, first, drain, grant)
    # The hold ended at the request, not at ready + first_request_s.
    assert drain["at"] - ready["at"] < FIRST_REQUEST_S / 2, (ready, first, drain)
    assert drain["at"] >= first["at"]


def test_a_malformed_served_count_is_refused_naming_it(berthd):
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "X", "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "2GiB"}]})
    assert code == 201, r
    lid = r["id"]
    for bad in ("many", -1, 1.5, [1]):
        code, r = d.call("POST", f"/v1/leases/{lid}/jobs", {"in_flight": 0, "served": bad})
        assert code == 400 and "served" in str(r), (bad, code, r)
    code, r = d.call("POST", f"/v1/leases/{lid}/jobs", {"in_flight": 0, "served": 3})
    assert code == 200 and r["served"] == 3, r
    assert d.lease_of("X")["served"] == 3


def test_the_reporter_sends_a_moved_count_at_once_while_idle(berthd):
    """The reporter's rule, against a real berthd: a served count that moved while the last
    report said nothing in flight goes at once (the request came and went between two polls);
    while busy it waits for ``every_s`` like any other change."""
    import asyncio

    from berth.client import Client, JobReporter

    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "X", "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "2GiB"}]})
    assert code == 201, r
    work, served = [(0, None)], [0]

    async def go() -> list[bool]:
        async with Client(socket=d.sock) as c:
            rep = JobReporter(lambda: work[0], lambda: r["id"], lambda: c,
                              served=lambda: served[0], every_s=3600.0)
            sent = [await rep.poll()]                  # the first report, in full
            served[0] = 1                              # answered between two polls
            sent.append(await rep.poll())
            sent.append(await rep.poll())              # nothing new
            work[0], served[0] = (1, None), 2          # busy: an edge
            sent.append(await rep.poll())
            served[0] = 3                              # busy, and more served: not at once
            sent.append(await rep.poll())
            return sent

    assert asyncio.run(go()) == [True, True, False, True, False]
    assert d.lease_of("X")["served"] == 2
