"""Issue 12 case 4: a running job is not killed to make room when it could finish.

engine A streams a long answer; engine B needs A's room. The ladder knows A's requests in flight
(its front reports them): A is not displaced until they end (bounded by A's ``max_job``), and B
is told why while it waits. Seen on main before the fix: without a park, A was drained at once
and its stream died after a few tokens; with a checkpoint park, the park waited the release grace
(10 s here) for A to go quiet, then fell back to a drain and the stream died."""

from __future__ import annotations

import time

import pytest

from tests.berthd import wait_for
from tests.broker.conftest import Chat, engine_run, free_port, in_thread, serving, token_hold

# A 10 s stream: it outlasts B's start (``berth run``, a few seconds on a loaded machine), so B
# asks while A's job runs.
TOKENS, RATE = 200, 20.0


def _race(d, runs, park: bool, tokens: int = TOKENS, held: bool = False):
    """A streams a job of ``tokens`` tokens at RATE (``held``: held after its first token until
    B was told why it waits, at the stub's full speed after that); B asks meanwhile."""
    port = free_port()
    hold, flags = token_hold(d) if held else (None, ())
    # 2 GiB of weights: the stand-in cuda-checkpoint moves them well inside the grace.
    engine_run(d, runs, "A", front=port, park=park, weights="2GiB", engine_args=flags,
               **({} if held else {"tokens_per_s": RATE}))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    job = Chat(port, max_tokens=tokens, stream=True, timeout_s=90)
    t = in_thread(job)
    wait_for(lambda: job.tokens > 0, 30, "A's stream started")
    wait_for(lambda: (d.lease_of("A") or {}).get("in_flight") == 1, 5, "A's job known to berthd")
    engine_run(d, runs, "B")
    why = wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 10, "B waiting")
    assert "A" in why and "1 request in flight" in why, why
    if hold:
        assert job.tokens == 1 and job.finish is None, (job.tokens, job.finish)
        hold.unlink()
    t.join(60)
    assert job.status == 200 and job.error is None, (job.status, job.error)
    assert job.tokens == tokens and job.finish == "length", (job.tokens, job.finish)
    wait_for(lambda: serving(d, "B"), 60, "B serving once A's job ended")
    return d


def test_a_job_in_flight_finishes_before_a_drain(berthd, runs):
    d = _race(berthd(), runs, park=False, held=True)
    assert d.status()["counters"]["drains"] == 1


@pytest.mark.early(30)
def test_a_park_waits_for_the_job_not_the_release_grace(berthd, runs):
    # A 24 s job against a 10 s release grace (B's start, up to several seconds on a loaded
    # machine, comes out of the job's time first). The grace also bounds the checkpoint once the
    # job has ended: the stand-in cuda-checkpoint makes three calls, each a Python process
    # that took up to 1 s on a loaded 2-core machine, so a 4 s grace fell back to a drain there
    # ("`cuda-checkpoint --get-state ...` did not finish within 0.6 s") though the job was waited.
    d = _race(berthd(policy={"release_grace": "10s", "ram_budget": "64GiB"}), runs, park=True,
              tokens=480)
    c = d.status()["counters"]
    assert c["fallbacks_to_drain"] == 0 and c["drains"] == 0, c
    assert d.state_of("A") == "parked"


def test_max_job_bounds_the_wait(berthd, runs):
    """A job longer than its engine's ``max_job`` is stopped once that runs out: B does not
    wait for an 80 s stream of A's whose entry says max_job = "1s"."""
    d = berthd(extra='[engines.A]\nsize = "14GiB"\nmax_job = "1s"\n')
    port = free_port()
    engine_run(d, runs, "A", front=port, tokens_per_s=RATE)
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    job = Chat(port, max_tokens=1600, stream=True, timeout_s=120)
    t = in_thread(job)
    wait_for(lambda: job.tokens > 0, 30, "A's stream started")
    t0 = time.monotonic()
    engine_run(d, runs, "B")
    # Within 40 s of B's start (its run and engine included): not after A's 80 s job.
    wait_for(lambda: serving(d, "B"), 40, "B serving after A's max_job")
    t.join(30)
    assert job.finish is None, "the 80 s job cannot have finished"
    assert time.monotonic() - t0 < 40


@pytest.mark.early(30)
def test_a_holder_serves_its_older_queue_before_a_later_waiter(berthd, runs):
    """Issue 16, FIFO turns live: A (one slot, --max-in-flight 1) has one request running and
    three queued at its front when B asks for the card. A keeps the card until the requests that
    came before B's ask are answered, then yields. Before the front reported the oldest
    request's age (and counted held requests as work), A was drained once its one running
    request ended and the three queued ones were answered 503."""
    d = berthd()
    port = free_port()
    engine_run(d, runs, "A", front=port, tokens_per_s=RATE, run_args=("--max-in-flight", "1"))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    jobs = [Chat(port, max_tokens=120, timeout_s=120) for _ in range(4)]   # about 6 s each
    threads = [in_thread(j) for j in jobs]
    le = wait_for(lambda: (lambda x: x if x and x["in_flight"] == 4 else None)(d.lease_of("A")),
                  30, "A's four requests known to berthd")
    assert le["oldest_job_age_s"] is not None, le
    engine_run(d, runs, "B")
    # Once A's turn (at least what its start cost) has run out, its older requests keep it.
    wait_for(lambda: "older than B's" in ((d.status()["waiting"] or [{}])[0].get("why") or ""),
             20, "B told that A serves older requests")
    for t in threads:
        t.join(60)
    assert [j.status for j in jobs] == [200] * 4, [(j.status, j.body) for j in jobs]
    wait_for(lambda: serving(d, "B"), 60, "B serving once A's older requests were answered")
    assert d.status()["counters"]["drains"] == 1


@pytest.mark.parametrize("preempt", [False, True], ids=["no-right", "preempt"])
def test_a_higher_priority_stops_a_job_only_where_its_entry_allows_it(berthd, runs, preempt):
    """A higher priority is no right to kill a running job: B (priority 5) waits for A's job
    unless B's entry says ``preempt = true``, and then A is stopped at once. On main A was
    stopped at once either way."""
    d = berthd(extra=f"[engines.B]\npriority = 5\npreempt = {str(preempt).lower()}\n")
    port = free_port()
    # Without the right, A's job is held after its first token until B was told why it waits;
    # with it, a 20 s stream that B's grant stops.
    hold, flags = (None, ()) if preempt else token_hold(d)
    engine_run(d, runs, "A", front=port, weights="2GiB", engine_args=flags,
               **({"tokens_per_s": RATE} if preempt else {}))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    job = Chat(port, max_tokens=2 * TOKENS, stream=True, timeout_s=90)
    t = in_thread(job)
    wait_for(lambda: job.tokens > 0, 30, "A's stream started")
    wait_for(lambda: (d.lease_of("A") or {}).get("in_flight") == 1, 5, "A's job known to berthd")
    engine_run(d, runs, "B", priority=5)
    if hold:
        why = wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 60, "B waiting")
        assert "A" in why and "1 request in flight" in why, why
        assert job.tokens == 1 and job.finish is None, (job.tokens, job.finish)
        hold.unlink()
    wait_for(lambda: serving(d, "B"), 60, "B serving")
    t.join(60)
    if preempt:
        assert job.finish is None and job.tokens < 2 * TOKENS, (job.tokens, job.finish)
    else:
        assert job.error is None and job.tokens == 2 * TOKENS and job.finish == "length", \
            (job.tokens, job.finish, job.error)
    assert d.status()["counters"]["drains"] == 1


@pytest.mark.early(40)
def test_a_waiters_park_waits_for_older_requests_not_for_newer_ones(berthd, runs):
    """Issue 34, the fence, live: A (one slot, a checkpoint park) runs a 20 s request older than
    B's ask; two more of A's requests come after B asked and are held at A's front. A parks as
    soon as its older request ends, and B serves while A's newer requests are still held (they
    go after A's wake). Before, A's older request kept the card and the instant it ended A's
    front forwarded the next one, so the park waited for a newer request (6 s) too. The turns
    are short here (2 s) so that they do not cover the race; the default's turns batch a
    holder's own requests first, by design."""
    d = berthd(policy={"release_grace": "10s", "ram_budget": "64GiB", "min_turn": "2s",
                       "max_turn": "2s"})
    port = free_port()
    engine_run(d, runs, "A", front=port, park=True, tokens_per_s=RATE, weights="2GiB",
               run_args=("--max-in-flight", "1"))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    older = Chat(port, max_tokens=400, stream=True, timeout_s=120)      # 20 s
    t_older = in_thread(older)
    wait_for(lambda: older.tokens > 0, 30, "A's older request running")
    engine_run(d, runs, "B")
    wait_for(lambda: (d.status()["waiting"] or [{}])[0].get("why"), 30, "B waiting")
    newer = [Chat(port, max_tokens=120, stream=True, timeout_s=120) for _ in range(2)]
    threads = [in_thread(j) for j in newer]
    wait_for(lambda: (d.lease_of("A") or {}).get("in_flight") == 3, 10,
             "A's newer requests held at its front, known to berthd")
    assert older.finish is None, "the older request must still run when the newer ones come"
    wait_for(lambda: serving(d, "B") or any(j.tokens for j in newer), 60,
             "B serving once A's older request ended")
    t_older.join(60)
    assert older.status == 200 and older.finish == "length", (older.status, older.error)
    for t in threads:
        t.join(90)
    assert [(j.status, j.finish) for j in newer] == [(200, "length")] * 2, \
        [(j.status, j.error) for j in newer]
    # B was granted before either newer request had a token (berthd's timeline and the
    # clients' clocks are one: monotonic). A poll of B's serving could miss it on a loaded
    # machine: B, with no request of its own, yields to A's held requests soon after.
    granted = [e["at"] for e in d.timeline() if e["engine"] == "B" and e["kind"] == "grant"]
    assert granted and granted[0] < min(j.first_at for j in newer), \
        ("B waited for a request newer than its own", granted, [j.first_at for j in newer])
    c = d.status()["counters"]
    # A parked once for B (no fallback); B, which cannot park, drains for A's wake.
    assert c["fallbacks_to_drain"] == 0 and c["checkpoints"] >= 1, c
