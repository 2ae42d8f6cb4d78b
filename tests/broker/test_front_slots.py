"""Issue 34: a front forwards what its engine runs at once (its slots) and holds the rest, so a
park waits for the running request, not for a backlog in the engine's own queue.

Engine A (the stub with ``--parallel 1``: one slot, the rest queued inside it, as llama-server
does) has one long request running and five short ones behind it when B, of higher priority,
asks for the card. ``berth run`` measured A's slot from its ``/props``, so the five are held in
A's front: A parks as soon as the running request ends, the five stay held across the park
(berthd still counts them as A's work), and once B has gone and A is awake they are answered,
all 200 (their clients send ``X-Berth-Deadline``: against a higher priority a held request is
otherwise answered at once, issue 12 case 6). Before, the front forwarded all six into the engine's queue and the park waited for
every one of them."""

from __future__ import annotations

import signal

import pytest

from tests.berthd import wait_for
from tests.broker.conftest import (
    Chat,
    engine_run,
    free_port,
    in_thread,
    run_log,
    serving,
    token_hold,
)

LONG_TOKENS = 400          # held after its first token until B was told why it waits
BACKLOG = 5


@pytest.mark.early(15)
def test_a_park_waits_for_the_running_request_and_the_backlog_stays_held(berthd, runs):
    d = berthd(policy={"release_grace": "10s", "ram_budget": "64GiB"},
               extra="[engines.B]\npriority = 5\n")
    port = free_port()
    hold, flags = token_hold(d)
    engine_run(d, runs, "A", front=port, park=True, weights="2GiB",
               engine_args=("--parallel", "1", *flags))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    assert "forwards at most 1 request at once to A (measured" in run_log(d, "A")
    running = Chat(port, max_tokens=LONG_TOKENS, stream=True, timeout_s=120)
    threads = [in_thread(running)]
    wait_for(lambda: running.tokens > 0, 30, "A's long request running")
    # B's priority keeps the card from A whatever is under way, so a request held for A would
    # be answered 503 at once (issue 12 case 6) unless its client asks to wait.
    backlog = [Chat(port, max_tokens=4, timeout_s=120, headers={"X-Berth-Deadline": "100"})
               for _ in range(BACKLOG)]
    for i, job in enumerate(backlog):
        threads.append(in_thread(job))
        wait_for(lambda i=i: (d.lease_of("A") or {}).get("in_flight") == i + 2, 10,
                 f"request {i + 2} known to berthd")
    b = engine_run(d, runs, "B", weights="2GiB")
    # The long request holds A's park: B waits for it, A still serving, the backlog held.
    why = wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 60, "B waiting")
    assert "park A" in why and f"{BACKLOG + 1} requests in flight" in why, why
    assert d.state_of("A") != "parked" and d.lease_of("A")["in_flight"] == BACKLOG + 1
    assert running.tokens == 1 and running.finish is None, (running.tokens, running.finish)
    assert [j.status for j in backlog] == [None] * BACKLOG
    hold.unlink()
    wait_for(lambda: d.state_of("A") == "parked", 60, "A parked for B")
    assert running.status == 200 and running.finish == "length", (running.status,
                                                                   running.error)
    assert [j.status for j in backlog] == [None] * BACKLOG, "the backlog went before the park"
    assert d.lease_of("A")["in_flight"] == BACKLOG     # held: still A's demand
    wait_for(lambda: serving(d, "B"), 60, "B serving")
    b.send_signal(signal.SIGTERM)
    wait_for(lambda: serving(d, "A"), 60, "A awake once B has gone")
    for t in threads:
        t.join(60)
    assert [j.status for j in backlog] == [200] * BACKLOG, [(j.status, j.body) for j in backlog]
    c = d.status()["counters"]
    assert c["fallbacks_to_drain"] == 0 and c["drains"] == 0, c
