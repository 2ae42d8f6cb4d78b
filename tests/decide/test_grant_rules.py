"""Issue 12, the pure half: the scheduler grants only on a driver read taken in the same step
(rule 1), a higher priority is not held back by a minimum turn, the ladder waits for a holder's
requests in flight (bounded by its ``max_job``), and every wait says its cause and whether
anything under way could end it. Virtual time, no I/O."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.model import Card, Lease, Share, ShareState
from berth.decide.scheduler import CardRead, Granted, Instruct, ReadCards, Scheduler

from tests.decide.world import GiB, World, pci_of

S = ShareState
G0 = pci_of(0)


def _sched(**pol) -> Scheduler:
    s = Scheduler(Policy(**{"min_turn_s": 0, "juggle_window_s": 0, **pol}))
    s.ledger.add_card(Card(G0, "gpu0", 24 * GiB, reserve_bytes=GiB))
    return s


def test_a_grant_waits_for_a_read_taken_in_its_own_step():
    s = _sched()
    s.observe({G0: CardRead(free_bytes=24 * GiB)}, 0.0)
    fx = s.request(Lease("b", "B", {G0: Share(G0, 22 * GiB)}), 0.5)
    assert not [e for e in fx if isinstance(e, Granted)]
    asks = [e for e in fx if isinstance(e, ReadCards)]
    assert asks and asks[0].cards == (G0,)
    # The read the broker takes at once shows a stowaway: no grant, and the wait says why.
    fx = s.observe({G0: CardRead(free_bytes=20 * GiB + 3 * GiB // 4, stowaway_bytes=13 * GiB // 4,
                                 stowaways={4242: 13 * GiB // 4})}, 0.51)
    assert not [e for e in fx if isinstance(e, Granted)]
    why, lasting = s.wait_cause("b")
    assert "stowaway pid 4242" in why and lasting, why
    fx = s.observe({G0: CardRead(free_bytes=24 * GiB)}, 0.9)
    assert [e for e in fx if isinstance(e, Granted)]


def test_a_higher_priority_does_not_wait_out_a_minimum_turn():
    w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
    w.request("a", "A", {G0: 14 * GiB})
    w.advance(1)
    w.request("b", "B", {G0: 14 * GiB}, priority=5)
    assert w.s.ledger.leases["a"].shares[G0].state is S.DRAINING
    w.request("c", "C", {G0: 14 * GiB}, priority=5)
    why, lasting = w.s.wait_cause("c")
    assert why and not lasting


def test_a_busy_holder_is_drained_only_after_its_jobs_bounded_by_max_job():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    w.apply(w.s.jobs("a", 1, w.now))
    w.advance(5)
    w.request("b", "B", {G0: 14 * GiB})
    drain = [e for e in w.effects if isinstance(e, Instruct) and e.op == "drain"][-1]
    assert drain.quiet_s == 3600 - 5
    why, lasting = w.s.wait_cause("b")
    assert "A" in why and "1 request in flight" in why and not lasting, why


def test_only_a_waiter_with_the_right_preempts_a_job():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    w.apply(w.s.jobs("a", 2, w.now))
    w.s.ledger.leases  # noqa: B018
    lease = Lease("b", "B", {G0: Share(G0, 14 * GiB)}, priority=5, may_preempt=True)
    w.apply(w.s.request(lease, w.now))
    drain = [e for e in w.effects if isinstance(e, Instruct) and e.op == "drain"][-1]
    assert drain.quiet_s == 0


def test_an_idle_higher_priority_holder_is_a_lasting_cause():
    w = World([24 * GiB], reserve=GiB)
    w.request("a", "boss", {G0: 14 * GiB}, priority=5)
    w.apply(w.s.jobs("a", 0, w.now))            # its front says it is idle
    w.request("b", "minion", {G0: 14 * GiB})
    why, lasting = w.s.wait_cause("b")
    assert lasting and "boss (priority 5, 0 requests in flight)" in why, why


def test_a_release_being_confirmed_is_no_lasting_cause():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    w.exit("a")
    w.request("b", "B", {G0: 14 * GiB})
    why, lasting = w.s.wait_cause("b")
    assert "being confirmed free" in why and not lasting, why
