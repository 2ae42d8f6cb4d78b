"""Placement: the card of each share, chosen by the scheduler inside the single writer
(``berth.decide.placement``; issue 23 "decide inside the single writer", issue 7)."""

from __future__ import annotations

import pytest
from berth.decide.admission import Policy
from berth.decide.demand import recent
from berth.decide.model import Capabilities, Lease, ParkMechanism, ShareState
from berth.decide.placement import Ask, PlacementError, Score, place
from berth.decide.scheduler import Granted, Instruct, Note
from berth.decide.units import format_size

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

    def test_two_shares_that_name_no_card_go_on_two_cards(self):
        w = _world()
        assert sorted(place(w.s.ledger, [Ask(None, GiB), Ask(None, GiB)], {})) == [G0, G1]

    def test_an_adopted_process_keeps_its_card(self):
        w = _world()
        assert place(w.s.ledger, [Ask(None, GiB)], {G0: 3 * GiB, G1: 0}) == [G0]
        assert place(w.s.ledger, [Ask(None, GiB)], {G0: None, G1: None}) == [G1]

    @pytest.mark.parametrize("asks, field, words", [
        ([Ask("gpu7", GiB)], "shares.0.card", "gpu7"),
        ([Ask("gpu0", GiB), Ask(G0, GiB)], "shares.1.card", "named twice"),
        ([Ask(None, GiB)] * 3, "shares.2.card", "only 2 cards can hold"),
        ([Ask(None, 64 * GiB)], "shares.0.size", "larger than every card's capacity"),
        ([Ask("gpu0", 0)], "shares.0.size", "more than 0 bytes"),
    ])
    def test_a_share_that_cannot_be_placed_is_named(self, asks, field, words):
        w = _world()
        with pytest.raises(PlacementError, match=words) as e:
            place(w.s.ledger, asks, {})
        assert e.value.field == field and str(e.value).startswith(field + ": ")


    def test_a_share_larger_than_every_card_says_the_largest_capacity(self):
        # `berth run --size 3900MiB` on a 4 GiB card with a 512 MiB reserve was told only
        # "3.8GiB is larger than every card's capacity": the user could not see it is 3.5 GiB.
        w = _world()
        cap = w.s.ledger.cards[G0].capacity_bytes
        with pytest.raises(PlacementError) as e:
            place(w.s.ledger, [Ask(None, 64 * GiB)], {})
        assert f"the largest is gpu0's {format_size(cap)}" in str(e.value), str(e.value)
        assert "less its reserve" in str(e.value), str(e.value)


class TestSchedulerPlace:
    def test_the_scheduler_places_then_the_grant_places_again_by_best_fit(self):
        w = _world()
        lease = Lease("small", "small", {})
        w.s.place(lease, [Ask(None, 2 * GiB, need_bytes=GiB)], {})
        assert list(lease.shares) == [G1] and lease.need_bytes == {G1: GiB}
        assert lease.movable == {G1}
        assert lease.shares[G1].state is ShareState.WAITING
        w.apply(w.s.request(lease, w.now))
        grants = [e for e in w.effects if isinstance(e, Granted) and e.lease_id == "small"]
        # At the grant gpu0's 4 GiB hole is the best fit; gpu1's 16 GiB stays whole.
        assert grants and list(grants[0].cards) == [G0]
        assert lease.need_bytes == {G0: GiB}

    def test_a_refused_placement_changes_nothing(self):
        w = _world()
        lease = Lease("small", "small", {})
        with pytest.raises(PlacementError):
            w.s.place(lease, [Ask("gpu9", GiB)], {})
        assert lease.shares == {} and "small" not in w.s.ledger.leases


def _ask(w: World, lid: str, asks: list[Ask], *, park: ParkMechanism | None = None,
         apply: bool = True) -> list:
    """A lease asked for as berthd's control API does: placed, then requested."""
    caps = Capabilities(park=park, front="127.0.0.1:1" if park else None)
    lease = Lease(lid, lid, {}, caps=caps)
    w.s.place(lease, asks, {})
    fx = w.s.request(lease, w.now)
    if apply:
        w.apply(fx)
    return fx


def _cards_of(w: World, lid: str) -> list[str]:
    return sorted(w.s.ledger.cards[p].name for p in w.s.ledger.leases[lid].shares)


def _two_cards_x_on_gpu0() -> World:
    """Issue 25's shape: two 24 GiB cards (1 GiB reserve each); X 16 GiB on gpu0 runs, and it
    has no park (only a drain would move it)."""
    w = World([24 * GiB, 24 * GiB], reserve=GiB)
    _ask(w, "X", [Ask("gpu0", 16 * GiB)])
    assert "X" in w.granted_order
    return w


def _displaced(w: World) -> list:
    return [e for e in w.effects if isinstance(e, Instruct) and e.op in ("park", "drain")]


class TestPlacedAtGrant:
    """Issue 25: placement is decided at grant time, by the ladder's cost and then best fit."""

    def test_best_fit_places_all_four_with_nothing_displaced(self):
        w = _two_cards_x_on_gpu0()
        for lid, size in (("N", 10), ("P", 6), ("Q", 12)):
            _ask(w, lid, [Ask(None, size * GiB)])
        w.do_all()
        assert w.granted_order == ["X", "N", "P", "Q"]
        assert {lid: _cards_of(w, lid) for lid in "XNPQ"} == {
            "X": ["gpu0"], "N": ["gpu1"], "P": ["gpu0"], "Q": ["gpu1"]}
        assert _displaced(w) == [] and not w.pending
        w.check()

    def test_the_same_when_all_three_wait_on_one_read(self):
        """N, P and Q arrive before berthd's read (rule 1): the pass that holds them for it
        counts what the earlier ones will take, so Q is not put where P goes."""
        w = _two_cards_x_on_gpu0()
        w.now += 1.0            # the last read is older than the requests now
        fx = []
        for lid, size in (("N", 10), ("P", 6), ("Q", 12)):
            fx += _ask(w, lid, [Ask(None, size * GiB)], apply=False)
        assert not any(isinstance(e, Granted) for e in fx)
        w.read()
        w.do_all()
        assert sorted(w.granted_order) == ["N", "P", "Q", "X"]
        assert {lid: _cards_of(w, lid) for lid in "NPQ"} == {
            "N": ["gpu1"], "P": ["gpu0"], "Q": ["gpu1"]}
        assert _displaced(w) == []
        w.check()

    def test_the_grant_says_where_and_why(self):
        w = _two_cards_x_on_gpu0()
        _ask(w, "N", [Ask(None, 10 * GiB)])
        _ask(w, "P", [Ask(None, 6 * GiB)])
        note = [e for e in w.effects if isinstance(e, Note) and e.kind == "grant"
                and e.lease_id == "P"][0]
        assert "placed on gpu0: it fits there with 1.0GiB left over, the best fit" in note.text
        assert note.data["placed"].startswith("placed on gpu0")
        req = [e for e in w.effects if isinstance(e, Note) and e.kind == "request"
               and e.lease_id == "P"][0]
        assert req.text == "P asks for 6.0GiB on any card"

    def test_a_named_card_is_never_moved(self):
        w = _two_cards_x_on_gpu0()
        _ask(w, "N", [Ask("gpu0", 10 * GiB)])
        assert "N" not in w.granted_order and _cards_of(w, "N") == ["gpu0"]

    def test_room_made_fixes_the_cards(self):
        """Once the ladder makes room for a waiter, it stays on those cards (a park under way
        must not be wasted)."""
        w = World([24 * GiB, 24 * GiB], reserve=GiB)
        _ask(w, "A", [Ask("gpu0", 20 * GiB)], park=ParkMechanism.CHECKPOINT)
        _ask(w, "B", [Ask("gpu1", 20 * GiB)], park=ParkMechanism.CHECKPOINT)
        w.s.jobs("A", 0, w.now)
        w.s.jobs("B", 0, w.now)
        _ask(w, "C", [Ask(None, 10 * GiB)])
        parks = [e for e in w.pending if e.op == "park"]
        assert len(parks) == 1
        victim_card = w.s.ledger.leases[parks[0].lease_id].cards
        assert w.s.ledger.leases["C"].cards == victim_card
        w.advance(1.0)
        assert w.s.ledger.leases["C"].cards == victim_card
        w.do_all()
        assert "C" in w.granted_order and w.s.ledger.leases["C"].cards == victim_card


class TestAnyTwoOfFour:
    """A multi-card engine that asks for any 2 of 4 cards goes on the pair that can serve it
    soonest (issue 25)."""

    def _four(self) -> World:
        """gpu0: D, which cannot park (a drain); gpu1: S, a slow park; gpu2: F, a fast
        park; gpu3 empty. Every holder 16 GiB of 24, idle."""
        w = World([24 * GiB] * 4, reserve=GiB)
        _ask(w, "D", [Ask("gpu0", 16 * GiB)])
        _ask(w, "S", [Ask("gpu1", 16 * GiB)], park=ParkMechanism.CHECKPOINT)
        _ask(w, "F", [Ask("gpu2", 16 * GiB)], park=ParkMechanism.CHECKPOINT)
        led = w.s.ledger
        led.leases["S"].park_cost_s, led.leases["S"].switch_cost_s = 6.0, 6.0
        led.leases["F"].park_cost_s, led.leases["F"].switch_cost_s = 1.0, 1.0
        for lid in "DSF":
            w.s.jobs(lid, 0, w.now)
        w.advance(60.0)         # idle for longer than a switch back would cost (issue 24)
        return w

    def test_the_pair_with_the_cheapest_room(self):
        w = self._four()
        _ask(w, "T", [Ask(None, 12 * GiB), Ask(None, 12 * GiB)])
        assert _cards_of(w, "T") == ["gpu2", "gpu3"]
        assert [(e.op, e.lease_id) for e in w.pending] == [("park", "F")]
        w.do_all()
        assert "T" in w.granted_order and _displaced(w)[0].lease_id == "F"
        assert {"D", "S"}.isdisjoint({e.lease_id for e in _displaced(w)})
        w.check()

    def test_a_pair_that_fits_now_beats_any_park(self):
        w = self._four()
        w.exit("S")
        w.confirm_all()
        _ask(w, "T", [Ask(None, 12 * GiB), Ask(None, 12 * GiB)])
        assert "T" in w.granted_order and _cards_of(w, "T") == ["gpu1", "gpu3"]
        assert _displaced(w) == []

    def test_a_drain_of_an_engine_that_cannot_park_comes_last(self):
        w = self._four()
        _ask(w, "T", [Ask(None, 12 * GiB)] * 3)
        assert _cards_of(w, "T") == ["gpu1", "gpu2", "gpu3"]
        assert sorted(e.lease_id for e in w.pending) == ["F", "S"]


def test_scores_order_by_tier_then_cost_then_fit():
    assert Score(0, 0.0, 0, 5) < Score(0, 0.0, 0, 7) < Score(1, 0.0, 0, 0) \
        < Score(2, 1.0, 0, 0) < Score(2, 6.0, 0, 0) < Score(4, 0.0, 0, 0)


class TestDemandOverSeveralCards:
    """Issue 35: a lease over several cards does not park holders asked for more than itself
    while it can wait for the cards of holders asked for less (``placement._rank``)."""

    def _four(self, busy_cards: tuple[str, ...] = ()) -> World:
        """Four 24 GiB cards (1 GiB reserve). gpu0: H, 16 GiB, the cheapest park (1 s), asked
        for five times in the last minutes; gpu1: S, a slow park (6 s); gpu2: F, a fast park
        (1 s); gpu3 empty. All idle for a minute, unless on ``busy_cards``: those serve a
        request older than any later waiter's (their turn keeps the card)."""
        w = World([24 * GiB] * 4, reserve=GiB)
        for lid, card, cost in (("H", "gpu0", 1.0), ("S", "gpu1", 6.0), ("F", "gpu2", 1.0)):
            _ask(w, lid, [Ask(card, 16 * GiB)], park=ParkMechanism.CHECKPOINT)
            le = w.s.ledger.leases[lid]
            le.park_cost_s = le.switch_cost_s = cost
        for _ in range(5):
            w.apply(w.s.jobs("H", 1, w.now, oldest_at=w.now))
            w.advance(5.0)
            w.apply(w.s.jobs("H", 0, w.now))
            w.advance(20.0)
        for lid in "SF":
            card = _cards_of(w, lid)[0]
            w.apply(w.s.jobs(lid, 1 if card in busy_cards else 0, w.now, oldest_at=w.now))
        w.advance(60.0)         # idle for longer than a switch back would cost (issue 24)
        return w

    def test_it_parks_holders_in_less_demand_before_a_cheaper_park_of_a_busier_one(self):
        w = self._four()
        _ask(w, "T", [Ask(None, 12 * GiB)] * 3)
        # By cost alone gpu0+gpu2+gpu3 (H and F, 2 s); H was asked for five times.
        assert _cards_of(w, "T") == ["gpu1", "gpu2", "gpu3"]
        assert sorted(e.lease_id for e in w.pending if e.op == "park") == ["F", "S"]

    def test_it_waits_for_holders_in_less_demand_rather_than_park_a_busier_one(self):
        w = self._four(busy_cards=("gpu1", "gpu2"))
        _ask(w, "T", [Ask(None, 12 * GiB)] * 2)
        assert "T" not in w.granted_order
        assert "gpu0" not in _cards_of(w, "T")
        assert not [e for e in w.pending if e.lease_id == "H"]

    def test_after_the_defer_limit_the_plain_ranking_comes_back(self):
        from berth.decide.placement import DEFER_LIMIT_S
        w = self._four(busy_cards=("gpu1", "gpu2"))
        _ask(w, "T", [Ask(None, 12 * GiB)] * 2)
        assert not [e for e in w.pending if e.lease_id == "H"]
        w.advance(DEFER_LIMIT_S)
        assert _cards_of(w, "T") == ["gpu0", "gpu3"]
        assert [(e.op, e.lease_id) for e in w.pending] == [("park", "H")]

    def test_a_holder_serving_now_weighs_more_than_one_asked_for_lately(self):
        # T has waited (its front holds a request from before), so S's later requests do not
        # keep S's card; every set displaces more than T's own demand. H was asked for five
        # times in the last minutes and is idle; S was asked for twice and serves two
        # requests now: its park waits for them, and its client's next request follows.
        w = self._four()
        s = w.s.ledger.leases["S"]
        for _ in range(2):
            w.apply(w.s.jobs("S", 1, w.now, oldest_at=w.now))
            w.advance(2.0)
            w.apply(w.s.jobs("S", 0, w.now))
            w.advance(2.0)
        t = Lease("T", "T", {}, caps=Capabilities())
        w.s.place(t, [Ask(None, 12 * GiB)] * 3, {})
        t.oldest_job_at = w.now - 30.0
        w.apply(w.s.jobs("S", 2, w.now, oldest_at=w.now))
        assert recent(s, w.now) < recent(w.s.ledger.leases["H"], w.now)
        w.apply(w.s.request(t, w.now))
        # By demand asked for lately alone: gpu1+gpu2+gpu3 (S and F); S serves two now.
        assert _cards_of(w, "T") == ["gpu0", "gpu2", "gpu3"]
        assert sorted(e.lease_id for e in w.pending if e.op == "park") == ["F", "H"]

    def test_a_one_card_waiter_keeps_the_plain_ranking(self):
        w = self._four()
        _ask(w, "X", [Ask("gpu3", 20 * GiB)])        # gpu3 is taken: no card fits now
        assert "X" in w.granted_order
        f = w.s.ledger.leases["F"]
        f.park_cost_s = f.switch_cost_s = 3.0
        _ask(w, "T", [Ask(None, 12 * GiB)])
        # The cheapest park, H's, though H is asked for more than T (demand only breaks a tie).
        assert _cards_of(w, "T") == ["gpu0"]
        assert [(e.op, e.lease_id) for e in w.pending] == [("park", "H")]


def test_recent_counts_arrivals_in_the_window_and_one_while_it_serves():
    from berth.decide import demand
    le = Lease("x", "x", {})
    le.jobs_reported = True                 # its front said it serves nothing now
    for t in (10.0, 500.0, 950.0):
        demand.arrived(le, None, t)
        le.demand.asked_at = None           # each one a request at a front that had none
    assert demand.recent(le, 1000.0) == 2
    assert demand.recent(le, 1000.0, window_s=2000.0) == 3
    le.in_flight = 1
    assert demand.recent(le, 1000.0) == 3
