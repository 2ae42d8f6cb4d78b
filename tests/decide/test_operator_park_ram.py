"""An operator's park the host RAM budget cannot hold is refused up front, naming the budget and
what is left, as the ladder never plans one (a new user's find: `berth park coder` printed
"coder parks by checkpoint (operator)" and exited 0; the checkpoint tool then refused the park
for lack of host RAM and the engine was stopped instead)."""

from __future__ import annotations

import pytest
from berth.decide.model import ParkMechanism, ShareState

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)


def _two_checkpointed(budget: int) -> World:
    w = World([48 * GiB])
    w.s.ledger.ram_budget_bytes = budget
    w.request("q", "qwen", {G0: 14 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.request("c", "coder", {G0: 14 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.apply(w.s.operator("park", "q", w.now))
    w.do_all()
    assert w.s.ledger.leases["q"].shares[G0].state is ShareState.PARKED
    return w


def test_a_park_the_ram_budget_cannot_hold_is_refused_and_the_engine_keeps_serving():
    w = _two_checkpointed(18 * GiB)
    with pytest.raises(ValueError) as e:
        w.s.operator("park", "c", w.now)
    said = str(e.value)
    assert "coder cannot park now" in said and "ram_budget" in said and "berth drain coder" \
        in said, said
    assert w.s.ledger.leases["c"].shares[G0].state is ShareState.ACTIVE


def test_a_park_the_budget_holds_goes_ahead():
    w = _two_checkpointed(40 * GiB)
    w.apply(w.s.operator("park", "c", w.now))
    assert w.s.ledger.leases["c"].shares[G0].state is ShareState.PARKING
