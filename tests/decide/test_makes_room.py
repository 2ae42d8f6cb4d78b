"""Issue 35, pure: a waiter that makes no room (a drained run with no front asking for its card
again) drains, parks or moves no holder; it is granted once room frees by itself. Before, its
new lease was an ordinary waiter: at ``min_turn`` 0s it drained the holder that had drained it,
and the two supervisord programs swapped the card until the juggle guard stopped them."""

from __future__ import annotations

from berth.decide.model import Lease, Share, ShareState

from tests.decide.world import GiB, World, pci_of

S = ShareState
G0 = pci_of(0)


def _patient(w: World, lid: str, engine: str, size: int) -> None:
    w.apply(w.s.request(Lease(lid, engine, {G0: Share(G0, size)}, makes_room=False), w.now))


def test_a_waiter_that_makes_no_room_drains_no_one_and_says_why():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    _patient(w, "b", "B", 14 * GiB)
    w.advance(60.0)
    assert w.s.ledger.leases["a"].shares[G0].state is S.ACTIVE and not w.pending
    why, _ = w.s.wait_cause("b")
    assert "gpu0: short" in why and "B was drained and has no front" in why, why
    assert "makes no room" in why, why


def test_it_is_granted_once_the_holder_stops():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    _patient(w, "b", "B", 14 * GiB)
    w.exit("a")
    w.confirm_all()                 # the driver shows A's memory gone
    assert "b" in w.granted_order, w.effects[-5:]


def test_an_ordinary_waiter_still_drains_the_holder():
    """The control: the same waiter, asking as any lease does, is given room."""
    w = World([24 * GiB])
    w.request("a", "A", {G0: 14 * GiB})
    w.request("b", "B", {G0: 14 * GiB})
    assert w.pending and w.pending[0].lease_id == "a", w.pending
