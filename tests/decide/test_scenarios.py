"""Scenario tests named after the seeds (issue 2 acceptance). Pure: virtual time, no I/O."""

from __future__ import annotations

import pytest
from berth.decide.admission import Policy, QueuePolicy
from berth.decide.model import Bound, ParkMechanism, ShareState

from tests.decide.world import GiB, MiB, World, pci_of

S = ShareState
CKPT = ParkMechanism.CHECKPOINT
HOOK = ParkMechanism.HOOK
G0 = pci_of(0)


def state(w: World, lid: str, pci: str = G0) -> ShareState:
    return w.s.ledger.leases[lid].shares[pci].state


def notes(w: World, kind: str) -> list:
    return [e for e in w.effects if getattr(e, "kind", None) == kind]


class TestSeed002_MakingRoom:
    def test_waiter_fits_beside_a_parked_residual(self):
        # 24 GiB card; A (14 GiB, hook park) parks and leaves a 64 MiB residual; B (9 GiB)
        # then fits beside the residual and A's parked share keeps counting only the residual.
        w = World([24 * GiB])
        w.request("a", "A", {G0: 14 * GiB}, park=HOOK)
        w.apply(w.s.operator("park", "a", w.now))
        w.do_all()
        assert state(w, "a") is S.PARKED
        assert w.s.ledger.leases["a"].shares[G0].residual_bytes == 64 * MiB
        w.request("b", "B", {G0: 20 * GiB})
        assert state(w, "b") is S.ACTIVE
        grant = [e for e in notes(w, "grant") if e.lease_id == "b"][0]
        assert grant.data["rung"] == "beside_residual"
        assert w.s.ledger.counted(G0) == 20 * GiB + 64 * MiB
        w.check()

    def test_park_makes_room_then_wake_parks_the_other(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0), reserve=1 * GiB)
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.PARKING and state(w, "b") is S.WAITING
        w.do_all()
        assert state(w, "a") is S.PARKED and state(w, "b") is S.ACTIVE
        w.apply(w.s.wake("a", w.now))
        assert state(w, "b") is S.PARKING
        w.do_all()
        assert state(w, "a") is S.ACTIVE and state(w, "b") is S.PARKED
        assert w.s.counters.checkpoints == 2 and w.s.counters.wakes == 1
        w.check()

    def test_drain_when_the_holder_cannot_park(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB})
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.DRAINING
        w.do(0)                                   # the engine exits
        assert state(w, "a") is S.RELEASED        # counts until the driver says free
        assert state(w, "b") is S.WAITING
        w.confirm_all()
        assert "a" in w.ended and state(w, "b") is S.ACTIVE
        assert w.s.counters.drains == 1

    def test_lend_is_the_cheapest_rung_and_the_return_waits_for_the_driver(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=HOOK, lend=True, lend_max=8 * GiB)
        w.request("b", "B", {G0: 8 * GiB})
        assert state(w, "a") is S.LENDING          # lend before park
        w.do_all()
        a, b = (w.s.ledger.leases[x].shares[G0] for x in "ab")
        assert a.state is S.LENT and b.state is S.ACTIVE
        assert a.lent_bytes == 8 * GiB and a.lent_to == "b" and b.borrowed_from == "a"
        w.check()
        w.exit("b")
        assert state(w, "a") is S.LENT            # not before the driver read
        w.confirm_all()
        assert state(w, "a") is S.RETURNING
        w.do_all()
        assert state(w, "a") is S.ACTIVE and w.s.counters.returns == 1
        w.check()

    def test_five_card_lease_lends_from_one_card_while_the_other_four_serve(self):
        # Stage C, #189: Maya on five cards lends from one card while the other four serve.
        w = World([24 * GiB] * 5)
        maya = {pci_of(i): 22 * GiB for i in range(5)}
        w.request("maya", "Maya", maya, park=HOOK, lend=True, lend_max=10 * GiB)
        w.request("img", "ComfyUI", {pci_of(3): 8 * GiB})
        w.do_all()
        shares = w.s.ledger.leases["maya"].shares
        assert shares[pci_of(3)].state is S.LENT
        assert [shares[pci_of(i)].state for i in (0, 1, 2, 4)] == [S.ACTIVE] * 4
        assert state(w, "img", pci_of(3)) is S.ACTIVE
        w.check()

    def test_multi_card_waiter_gets_room_on_every_card_or_none(self):
        w = World([24 * GiB, 24 * GiB])
        w.request("x", "X", {pci_of(0): 20 * GiB}, priority=0, park=CKPT)
        w.request("y", "Y", {pci_of(1): 20 * GiB}, priority=9)       # cannot be displaced
        w.request("z", "Z", {pci_of(0): 10 * GiB, pci_of(1): 10 * GiB}, priority=5)
        assert state(w, "x", pci_of(0)) is S.ACTIVE                 # nothing moved for Z
        assert state(w, "z", pci_of(0)) is S.WAITING
        assert any("higher priority" in e.text for e in notes(w, "wait"))

    def test_park_needs_ram_budget_else_drain(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.s.ledger.ram_budget_bytes = 4 * GiB
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB})
        assert state(w, "a") is S.DRAINING
        # The drain says why it is not a park, to the run and so to `berth status`'s drained
        # row (a new user found it only in berthd's log).
        from berth.decide.effects import Instruct
        [drain] = [e for e in w.effects if isinstance(e, Instruct) and e.op == "drain"]
        assert "no park" in drain.reason and "RAM budget" in drain.reason, drain.reason


class TestSeed000_Admission:
    def test_head_of_line_needing_20k_tokens_with_15k_free_strict(self):
        # 128 KiB per token: the head needs 20,000 tokens' worth while 15,000 are free.
        tok = 128 * 1024
        w = World([40_000 * tok], Policy(queue=QueuePolicy.STRICT, min_turn_s=0))
        w.request("h", "holder", {G0: 25_000 * tok}, priority=9)
        w.request("big", "big", {G0: 20_000 * tok})
        w.request("small", "small", {G0: 1_000 * tok})
        assert state(w, "big") is S.WAITING and state(w, "small") is S.WAITING
        assert w.s.counters.admissions_rejected_with_free == 2
        w.exit("h")
        w.confirm_all()
        assert w.granted_order == ["h", "big", "small"]

    def test_head_of_line_needing_20k_tokens_with_15k_free_scan(self):
        tok = 128 * 1024
        w = World([40_000 * tok], Policy(queue=QueuePolicy.SCAN, scan_max_skips=2,
                                          scan_max_wait_s=1e9, min_turn_s=0))
        w.request("h", "holder", {G0: 25_000 * tok}, priority=9)
        w.request("big", "big", {G0: 20_000 * tok})
        for i in range(4):
            w.request(f"s{i}", "small", {G0: 1_000 * tok})
        # Two small waiters pass the head, then it turns strict and holds the card.
        assert w.granted_order == ["h", "s0", "s1"]
        assert w.s.queue.get("big").skips == 2
        w.exit("h")
        w.confirm_all()
        assert w.granted_order[3] == "big"

    def test_scan_head_turns_strict_after_waiting_long_enough(self):
        tok = 128 * 1024
        w = World([40_000 * tok], Policy(queue=QueuePolicy.SCAN, scan_max_skips=100,
                                          scan_max_wait_s=30, min_turn_s=0))
        w.request("h", "holder", {G0: 25_000 * tok}, priority=9)
        w.request("big", "big", {G0: 20_000 * tok})
        w.request("s0", "small", {G0: 1_000 * tok})
        w.advance(31)
        w.request("s1", "small", {G0: 1_000 * tok})
        assert "s0" in w.granted_order and "s1" not in w.granted_order

    def test_a_grant_that_would_spend_the_reserve_waits(self):
        w = World([24 * GiB], reserve=2 * GiB)
        w.request("a", "A", {G0: 12 * GiB}, priority=9)
        w.request("b", "B", {G0: 11 * GiB})       # 12 + 11 = 23 > 24 - 2
        assert state(w, "b") is S.WAITING
        assert w.s.ledger.available(G0) == 10 * GiB     # 24 - 2 reserve - 12
        w.request("c", "C", {G0: 10 * GiB})       # up to the reserve, not into it (scan)
        assert state(w, "c") is S.ACTIVE
        assert w.s.ledger.counted(G0) == 22 * GiB
        w.check()
        w.exit("a")
        w.confirm_all()
        assert state(w, "b") is S.ACTIVE

    def test_driver_free_bounds_admission_as_well_as_the_ledger(self):
        # A stowaway appeared since the last read: the driver's free bytes minus the reserve
        # decide, even though the ledger alone would grant.
        w = World([24 * GiB], reserve=1 * GiB)
        w.stowaway = 10 * GiB
        w.read()
        w.request("a", "A", {G0: 14 * GiB})
        assert state(w, "a") is S.WAITING
        assert w.s.ledger.cards[G0].stowaway_bytes == 10 * GiB

    def test_never_fits_is_told_apart_from_no_room_now(self):
        w = World([24 * GiB], reserve=1 * GiB, baseline=512 * MiB)
        w.request("huge", "huge", {G0: 23 * GiB})
        assert "huge" in w.rejected
        w.request("a", "A", {G0: 20 * GiB})
        w.request("b", "B", {G0: 20 * GiB})
        assert "b" not in w.rejected and state(w, "b") is S.WAITING

    def test_whole_card_lease_takes_the_card_budget(self):
        w = World([24 * GiB], reserve=1 * GiB, claims=2 * GiB)
        w.apply(w.s.request(_whole("a"), w.now))
        assert w.s.ledger.leases["a"].shares[G0].reserved_bytes == 21 * GiB

    def test_growth_bound_reserves_an_allowance_and_extends(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 16 * GiB}, bound=Bound.GROWTH, need={G0: 4 * GiB},
                  growth=2 * GiB)
        assert w.s.ledger.leases["a"].shares[G0].reserved_bytes == 6 * GiB
        w.used[("a", G0)] = 7 * GiB                # passes its reservation
        w.read()
        assert w.s.ledger.leases["a"].shares[G0].reserved_bytes == 9 * GiB
        assert w.s.counters.extensions == 1

    def test_current_bound_reserves_the_measured_need_only(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 16 * GiB}, bound=Bound.CURRENT, need={G0: 4 * GiB})
        assert w.s.ledger.leases["a"].shares[G0].reserved_bytes == 4 * GiB


class TestDisplacement:
    def test_priority_protects_a_holder(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, priority=5, park=CKPT)
        w.request("b", "B", {G0: 10 * GiB}, priority=1)
        assert state(w, "a") is S.ACTIVE and state(w, "b") is S.WAITING
        assert "higher priority" in notes(w, "wait")[-1].text

    def test_minimum_turn_protects_a_holder_until_it_ends(self):
        w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.ACTIVE
        assert "minimum turn" in notes(w, "wait")[-1].text
        w.advance(29)
        assert state(w, "a") is S.ACTIVE
        w.advance(2)
        assert state(w, "a") is S.PARKING

    def test_operator_hold_protects_a_holder(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.apply(w.s.operator("hold", "a", w.now))
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.ACTIVE
        w.apply(w.s.operator("release-hold", "a", w.now))
        assert state(w, "a") is S.PARKING

    def test_juggle_guard_stops_a_swap_back(self):
        pol = Policy(min_turn_s=0, juggle_window_s=120, juggle_max_swaps=1)
        w = World([24 * GiB], pol)
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.do_all()
        assert state(w, "b") is S.ACTIVE             # B took the card from A once
        w.advance(5)
        w.apply(w.s.wake("a", w.now))
        assert state(w, "b") is S.ACTIVE             # the swap back waits
        assert "juggle guard" in notes(w, "wait")[-1].text
        w.advance(120)
        assert state(w, "b") is S.PARKING            # the window passed

    def test_equal_priority_engines_may_swap(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.PARKING


class TestEverySleepHasAWayBack:
    def test_park_acknowledged_but_never_freed_falls_back_to_drain(self):
        w = World([24 * GiB], Policy(min_turn_s=0, release_grace_s=20))
        w.request("a", "A", {G0: 14 * GiB}, park=HOOK)
        w.request("b", "B", {G0: 14 * GiB})
        w.do(0, ok=True, frees=False)
        w.confirm_all()
        assert state(w, "a") is S.PARKING
        w.advance(19)
        assert state(w, "a") is S.PARKING
        w.advance(2)
        assert state(w, "a") is S.DRAINING
        assert w.s.counters.fallbacks_to_drain == 1
        w.do_all()
        assert state(w, "b") is S.ACTIVE

    def test_a_failed_park_falls_back_at_once(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB})
        w.do(0, ok=False)
        assert state(w, "a") is S.DRAINING

    def test_a_wake_that_never_answers_stops_the_engine(self):
        w = World([24 * GiB], Policy(min_turn_s=0, wake_limit_s=60))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.apply(w.s.operator("park", "a", w.now))
        w.do_all()
        w.apply(w.s.wake("a", w.now))
        assert state(w, "a") is S.RESUMING
        w.advance(61)
        assert state(w, "a") is S.DRAINING
        assert any(e.op == "drain" and "wake_limit" in e.reason for e in w.effects
                   if hasattr(e, "op"))

    def test_parked_engine_that_loads_again_is_unparked(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 14 * GiB}, park=HOOK)
        w.apply(w.s.operator("park", "a", w.now))
        w.do_all()
        w.used[("a", G0)] = 10 * GiB               # a client reached it around Berth
        w.read()
        assert state(w, "a") is S.ACTIVE
        assert w.s.counters.unparked == 1

    def test_park_is_refused_without_a_front(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 14 * GiB})
        with pytest.raises(ValueError, match="front"):
            w.s.operator("park", "a", w.now)


def _whole(lid: str):
    from berth.decide.model import Lease, Share
    return Lease(lid, lid, {G0: Share(G0, 0, whole_card=True)})


class TestFoundByThePolicySimulator:
    def test_a_wake_reserves_what_the_park_took_away(self):
        # current bound: reserved 11 GiB but seen using 16; parked; a 10 GiB holder comes in.
        # The wake must find room for 16 GiB, not 11.
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0), reserve=1 * GiB)
        w.request("a", "A", {G0: 18 * GiB}, park=CKPT, bound=Bound.CURRENT, need={G0: 11 * GiB})
        w.used[("a", G0)] = 16 * GiB
        w.read()
        w.request("b", "B", {G0: 10 * GiB}, priority=5)     # B cannot be displaced by A
        w.do_all()
        assert state(w, "a") is S.PARKED and state(w, "b") is S.ACTIVE
        assert w.s.ledger.leases["a"].shares[G0].parked_bytes == 16 * GiB
        w.apply(w.s.wake("a", w.now))
        assert state(w, "a") is S.PARKED                     # 13 GiB free < 16: it waits
        w.exit("b")
        w.confirm_all()
        assert state(w, "a") is S.RESUMING
        assert w.s.ledger.leases["a"].shares[G0].reserved_bytes == 16 * GiB
        w.do_all()
        assert state(w, "a") is S.ACTIVE
        w.check()

    def test_the_minimum_turn_counts_from_when_the_engine_can_serve(self):
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60))
        lease = _lease_not_ready(w, "big", 20 * GiB)          # a cold load, not serving yet
        w.advance(31)
        w.apply(w.s.ready(lease, w.now))                      # it serves at t = 31
        w.advance(1)
        w.request("small", "small", {G0: 12 * GiB})           # asks once big serves
        w.advance(8)
        assert state(w, "big") is S.ACTIVE                    # inside its turn (from t = 31)
        # The turn is worth what the load cost (31 s, issue 16), not just min_turn_s.
        w.advance(21)
        assert state(w, "big") is S.ACTIVE
        w.advance(2)
        assert state(w, "big") is S.DRAINING

    def test_a_waiter_that_asked_during_the_load_has_it_counted_in_the_turn(self):
        """Issue 34: small asked at t = 5, while big loaded (31 s): it has waited the switch
        the turn is worth, so big's turn keeps nothing past its start (before: 31 s more, a
        wait of 62 s where FIFO swapping makes it 31 s and a request)."""
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60))
        lease = _lease_not_ready(w, "big", 20 * GiB)
        w.advance(5)
        w.request("small", "small", {G0: 12 * GiB})
        w.advance(5)
        assert state(w, "big") is S.ACTIVE                    # starting: loads for its own
        w.advance(21)
        w.apply(w.s.ready(lease, w.now))                      # it serves at t = 31
        w.advance(9)
        assert state(w, "big") is S.DRAINING


def _lease_not_ready(w: World, lid: str, size: int) -> str:
    from berth.decide.model import Lease, Share
    w.s.request(Lease(lid, lid, {G0: Share(G0, size)}), w.now)
    return lid


class TestWithdrawalsAndExplanations:
    def test_a_wake_nobody_waits_for_any_more_is_withdrawn(self):
        w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.apply(w.s.operator("park", "a", w.now))
        w.do_all()
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.apply(w.s.wake("a", w.now))              # B is inside its turn: A's wake waits
        assert w.s.queue.get("a") is not None
        w.apply(w.s.unwake("a", w.now))            # the held request gave up
        assert w.s.queue.get("a") is None
        w.advance(60)                              # B's turn ends: nothing parks it for A
        assert state(w, "b") is S.ACTIVE and state(w, "a") is S.PARKED

    def test_a_park_whose_engine_cannot_go_quiet_is_called_off_when_nothing_waits(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.apply(w.s.operator("park", "a", w.now))
        w.pending.clear()
        w.apply(w.s.report("a", "park", False, w.now, "busy: in-flight requests did not finish"))
        assert state(w, "a") is S.ACTIVE and w.s.counters.fallbacks_to_drain == 0
        w.check()

    def test_a_busy_park_that_a_waiter_needs_still_falls_back_to_drain(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB})
        w.pending.clear()
        w.apply(w.s.report("a", "park", False, w.now, "busy: in-flight requests did not finish"))
        assert state(w, "a") is S.DRAINING and w.s.counters.fallbacks_to_drain == 1

    def test_the_plan_says_why_a_parkable_holder_is_drained(self):
        w = World([24 * GiB], Policy(min_turn_s=0))
        w.s.ledger.ram_budget_bytes = 4 * GiB
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 14 * GiB})
        plan = notes(w, "plan")[-1]
        assert "drain A (no park: it would put" in plan.text and "RAM budget" in plan.text

    def test_an_engine_over_its_lease_is_noted_once(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 4 * GiB})
        w.used[("a", G0)] = 6 * GiB
        w.read()
        w.read()
        over = notes(w, "over_lease")
        assert len(over) == 1 and over[0].data["used_bytes"] == 6 * GiB

    def test_an_engine_name_run_twice_is_ambiguous_for_the_operator(self):
        w = World([24 * GiB])
        w.request("a1", "dup", {G0: 4 * GiB})
        w.request("a2", "dup", {G0: 4 * GiB})
        with pytest.raises(ValueError, match="a1, a2"):
            w.s.find("dup")
        assert w.s.find("a2").id == "a2"

    def test_a_rejection_names_sizes_people_can_read(self):
        # `berth run --size 100GiB` on a 24 GiB card: the reason reaches the user as printed
        # (berth run's error line), so it gives GiB, not only 107374182400 bytes.
        w = World([24 * GiB])
        w.effects.clear()
        w.request("big", "big", {G0: 100 * GiB})
        assert "big" in w.rejected
        reason = [e for e in w.effects if type(e).__name__ == "Rejected"][0].reason
        assert "needs 100.0GiB" in reason and "capacity of 24.0GiB" in reason, reason


def test_an_operator_park_of_an_engine_without_one_says_how_to_give_it_one():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 8 * GiB})
    with pytest.raises(ValueError) as e:
        w.s.operator("park", "a", w.now)
    msg = str(e.value)
    assert "A cannot park: its run gave no --park" in msg, msg
    assert "--park checkpoint|hook" in msg and "berth drain" in msg, msg
