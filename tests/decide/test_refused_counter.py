"""The counter of waits with some memory free, not enough (``admissions_rejected_with_free``,
seed 000 "Measuring whether the policy works") counts only waits nothing is done for (issue 37:
on simulated cards it rose with every switch, a waiter for whom
a park was begun being counted as refused)."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.model import ParkMechanism, ShareState

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)
POLICY = Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0, first_request_s=0)


def test_a_switch_is_no_refusal():
    w = World([24 * GiB], POLICY)
    w.s.ledger.ram_budget_bytes = 64 * GiB
    w.request("a", "A", {G0: 14 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.request("b", "B", {G0: 14 * GiB})
    assert [p.op.value for p in w.pending] == ["park"]     # room is being made for B
    w.do_all()
    w.confirm_all()
    assert w.s.ledger.leases["b"].shares[G0].state is ShareState.ACTIVE
    assert w.s.counters.admissions_rejected_with_free == 0


def test_a_waiter_nothing_is_done_for_is_counted_once():
    w = World([24 * GiB], POLICY)
    w.request("a", "A", {G0: 14 * GiB}, priority=9)       # cannot be displaced
    w.request("b", "B", {G0: 14 * GiB})
    w.advance(1.0)
    w.read()
    assert w.s.ledger.leases["b"].shares[G0].state is ShareState.WAITING
    assert w.s.counters.admissions_rejected_with_free == 1
