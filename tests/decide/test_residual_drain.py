"""A holder whose park would leave too much on the card is drained, not left in the way.

Found by the real llama.cpp tests (issue 30): a hook park is expected to leave a residual
(measured, else ``hook_residual_guess_bytes`` capped at half the share), and when that residual
is more than the waiter can spare, the ladder planned a park that could not make room and, since
the holder can park, never a drain: the waiter got "no room" although draining the holder
would have made it. Pure: virtual time, no I/O.
"""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.model import ParkMechanism, ShareState

from tests.decide.world import GiB, MiB, World, pci_of

G0 = pci_of(0)


def test_a_park_that_cannot_make_room_falls_to_a_drain_in_the_plan():
    w = World([4 * GiB], Policy(min_turn_s=0, juggle_window_s=0), reserve=512 * MiB)
    w.request("a", "A", {G0: 3 * GiB}, park=ParkMechanism.HOOK)
    w.request("b", "B", {G0: 3 * GiB})
    # parking A is expected to leave 1.5 GiB (half its share, never measured): B would still be
    # 1 GiB short, so A drains
    assert w.s.ledger.leases["a"].shares[G0].state is ShareState.DRAINING
    said = " ".join(str(getattr(e, "text", "")) for e in w.effects)
    assert "would leave 1.5GiB on the card" in said, said
    w.do_all()
    w.confirm_all()
    assert w.s.ledger.leases["b"].shares[G0].state is ShareState.ACTIVE
    w.check()


def test_a_park_that_makes_room_is_still_preferred():
    w = World([4 * GiB], Policy(min_turn_s=0, juggle_window_s=0), reserve=512 * MiB)
    w.request("a", "A", {G0: 2 * GiB}, park=ParkMechanism.HOOK)
    w.request("b", "B", {G0: 2 * GiB})
    assert w.s.ledger.leases["a"].shares[G0].state is ShareState.PARKING
