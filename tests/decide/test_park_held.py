"""An operator's park or drain of a held lease goes ahead and says that it overrides the hold
(before, the hold was overridden silently: the CLI printed only the park)."""

from __future__ import annotations

from berth.decide.effects import Note
from berth.decide.model import ParkMechanism, ShareState

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)


def _held(w: World) -> None:
    w.request("a", "A", {G0: 8 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.apply(w.s.operator("hold", "a", w.now))


def _said(fx) -> list[str]:
    return [e.text for e in fx if isinstance(e, Note) and e.kind == "hold.override"]


def test_a_park_of_a_held_lease_says_it_overrides_the_hold_and_the_hold_stays():
    w = World([24 * GiB])
    _held(w)
    fx = w.s.operator("park", "a", w.now)
    w.apply(fx)
    assert _said(fx) == ["A is held by the operator: this park overrides the hold (the hold "
                         "stays: the engine is protected again once it wakes; `berth "
                         "release-hold A` ends it)"], fx
    assert w.s.ledger.leases["a"].shares[G0].state is ShareState.PARKING
    assert w.s.ledger.leases["a"].held


def test_a_drain_of_a_held_lease_says_so_and_one_not_held_says_nothing():
    w = World([24 * GiB])
    _held(w)
    fx = w.s.operator("drain", "a", w.now)
    assert _said(fx) == ["A is held by the operator: this drain overrides the hold (the hold "
                         "ends with the lease)"], fx
    w2 = World([24 * GiB])
    w2.request("b", "B", {G0: 8 * GiB}, park=ParkMechanism.CHECKPOINT)
    assert _said(w2.s.operator("park", "b", w2.now)) == []
