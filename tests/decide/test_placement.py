"""Placement: the card of each share, chosen by the scheduler inside the single writer
(``berth.decide.placement``; issue 23 "decide inside the single writer", issue 7)."""

from __future__ import annotations

import pytest
from berth.decide.admission import Policy
from berth.decide.model import Lease, ShareState
from berth.decide.placement import Ask, PlacementError, place
from berth.decide.scheduler import Granted

from tests.decide.world import GiB, World, pci_of

G0, G1 = pci_of(0), pci_of(1)


def _world() -> World:
    """gpu0 24 GiB with 20 GiB held by a lease; gpu1 16 GiB, empty."""
    w = World([24 * GiB, 16 * GiB], Policy(min_turn_s=0, juggle_window_s=0))
    w.request("big", "big", {G0: 20 * GiB})
    assert "big" in w.granted_order
    return w


class TestPlace:
    def test_a_named_card_by_name_or_pci(self):
        w = _world()
        assert place(w.s.ledger, [Ask("gpu1", GiB), Ask(G0, GiB)], {}) == [G1, G0]

    def test_an_unnamed_share_goes_where_the_most_room_is_now(self):
        w = _world()
        assert place(w.s.ledger, [Ask(None, 2 * GiB)], {}) == [G1]
        w.exit("big")
        w.confirm_all()
        assert "big" in w.ended
        assert place(w.s.ledger, [Ask(None, 2 * GiB)], {}) == [G0]

    def test_only_cards_whose_capacity_admits_the_size(self):
        w = _world()
        assert place(w.s.ledger, [Ask(None, 20 * GiB)], {}) == [G0]

    def test_an_adopted_process_keeps_its_card(self):
        w = _world()
        assert place(w.s.ledger, [Ask(None, GiB)], {G0: 3 * GiB, G1: 0}) == [G0]
        assert place(w.s.ledger, [Ask(None, GiB)], {G0: None, G1: None}) == [G1]

    @pytest.mark.parametrize("asks, field, words", [
        ([Ask("gpu7", GiB)], "shares.0.card", "gpu7"),
        ([Ask("gpu0", GiB), Ask(G0, GiB)], "shares.1.card", "named twice"),
        ([Ask(None, GiB), Ask(None, GiB)], "shares.1.card", "two shares name no card"),
        ([Ask(None, 64 * GiB)], "shares.0.size", "larger than every card's capacity"),
        ([Ask("gpu0", 0)], "shares.0.size", "more than 0 bytes"),
    ])
    def test_a_share_that_cannot_be_placed_is_named(self, asks, field, words):
        w = _world()
        with pytest.raises(PlacementError, match=words) as e:
            place(w.s.ledger, asks, {})
        assert e.value.field == field and str(e.value).startswith(field + ": ")


class TestSchedulerPlace:
    def test_the_scheduler_places_then_the_request_is_granted_there(self):
        w = _world()
        lease = Lease("small", "small", {})
        w.s.place(lease, [Ask(None, 2 * GiB, need_bytes=GiB)], {})
        assert list(lease.shares) == [G1] and lease.need_bytes == {G1: GiB}
        assert lease.shares[G1].state is ShareState.WAITING
        w.apply(w.s.request(lease, w.now))
        grants = [e for e in w.effects if isinstance(e, Granted) and e.lease_id == "small"]
        assert grants and list(grants[0].cards) == [G1]

    def test_a_refused_placement_changes_nothing(self):
        w = _world()
        lease = Lease("small", "small", {})
        with pytest.raises(PlacementError):
            w.s.place(lease, [Ask("gpu9", GiB)], {})
        assert lease.shares == {} and "small" not in w.s.ledger.leases
