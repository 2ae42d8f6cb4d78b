"""Turns protect work, not idleness (issue 16): the minimum turn, the juggle guard and a
priority hold a card for a holder that is serving, not for one that is idle. Pure: virtual time,
no I/O. Each of these failed before the change (the idle holder kept its turn, its guard and
its priority forever)."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.model import ParkMechanism, ShareState

from tests.decide.world import GiB, World, pci_of

S = ShareState
CKPT = ParkMechanism.CHECKPOINT
G0 = pci_of(0)


def state(w: World, lid: str) -> ShareState:
    return w.s.ledger.leases[lid].shares[G0].state


def jobs(w: World, lid: str, n: int) -> None:
    w.apply(w.s.jobs(lid, n, w.now))


def texts(w: World) -> list[str]:
    return [e.text for e in w.effects if getattr(e, "kind", None) == "wait"]


class TestIdleYields:
    def test_idle_holder_yields_inside_its_minimum_turn(self):
        # Its first request came and went; a switch back costs nothing measured here (issue
        # 24's rent is 0), so the idle holder yields at once.
        w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        jobs(w, "a", 1)
        jobs(w, "a", 0)
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.PARKING

    def test_busy_holder_keeps_its_turn_then_yields_when_it_goes_idle(self):
        w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        jobs(w, "a", 2)
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]
        w.advance(3)
        jobs(w, "a", 0)                 # its last request ended: the pass runs at once
        assert state(w, "a") is S.PARKING

    def test_a_front_that_never_reported_is_not_idle(self):
        w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.request("b", "B", {G0: 10 * GiB})
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]

    def test_negative_count_is_refused(self):
        w = World([24 * GiB])
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        try:
            w.s.jobs("a", -1, w.now)
        except ValueError as e:
            assert "in_flight" in str(e) and "-1" in str(e)
        else:
            raise AssertionError("a negative count was taken")


class TestJuggleGuardCountsContestedSwaps:
    def _swap(self, w: World, taker: str, victim: str, busy: bool) -> None:
        jobs(w, victim, 1 if busy else 0)
        w.advance(1)
        w.apply(w.s.wake(taker, w.now))
        if busy:
            w.advance(1)
            jobs(w, victim, 0)
        w.do_all()
        assert state(w, taker) is S.ACTIVE

    def test_idle_swaps_do_not_count(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=120, juggle_max_swaps=1,
                                     max_turn_s=0, first_request_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        jobs(w, "a", 0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.do_all()
        for _ in range(4):              # back and forth, nobody competing: no guard wait
            self._swap(w, "a", "b", busy=False)
            self._swap(w, "b", "a", busy=False)
        assert not any("juggle guard" in t for t in texts(w))
        assert w.s.swaps.count("A", "B", 0.0) == 0

    def test_contested_swaps_still_count(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=120, juggle_max_swaps=1,
                                     max_turn_s=0, first_request_s=0))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        jobs(w, "a", 1)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.do_all()
        assert state(w, "b") is S.ACTIVE and w.s.swaps.count("A", "B", 0.0) == 1
        jobs(w, "b", 1)
        w.advance(1)
        w.apply(w.s.wake("a", w.now))
        assert state(w, "b") is S.ACTIVE and "juggle guard" in texts(w)[-1]


class TestPriorityKeepWarm:
    def test_priority_protects_while_serving_and_for_keep_warm_only(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0))
        w.request("a", "A", {G0: 20 * GiB}, priority=5, park=CKPT)
        w.s.ledger.leases["a"].keep_warm_s = 60.0
        jobs(w, "a", 1)
        w.request("b", "B", {G0: 10 * GiB}, priority=1)
        w.advance(100)
        assert state(w, "a") is S.ACTIVE           # serving: protected however long
        jobs(w, "a", 0)
        assert state(w, "a") is S.ACTIVE           # idle, but inside keep_warm
        assert "higher priority" in texts(w)[-1]
        w.advance(61)
        assert state(w, "a") is S.PARKING          # keep_warm ran out: parked for anyone


class TestCostAwareTurns:
    """Issue 16: a turn is worth what the switch into it cost, and no engine waits behind
    requests that came after its own (as under llama-swap's FIFO). Both failed before: the
    holder lost its card after min_turn_s whatever its load cost, and a holder's newer requests
    kept nobody waiting."""

    def test_a_turn_lasts_at_least_what_the_load_cost(self):
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60,
                                     max_turn_s=0))
        w.s.request(_lease("a", 20 * GiB), w.now)
        w.advance(25)
        w.apply(w.s.ready("a", w.now))              # its load took 25 s
        jobs(w, "a", 1)
        w.request("b", "B", {G0: 10 * GiB})
        w.advance(15)                               # past min_turn_s, inside the 25 s
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]
        w.advance(11)
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.DRAINING

    def test_a_waiter_that_waited_through_the_switch_has_it_counted(self):
        """Issue 34: b asked while a was still loading (8 s); a's minimum turn (10 s) counts
        that switch, so b waits the turn, not the load and then the whole turn. Before: a kept
        its card idle to 8 + 10 = 18 s (bursty ping-pong's second client waited 25-31 s where
        llama-swap's FIFO made it wait 23 s)."""
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60,
                                     max_turn_s=0))
        w.s.request(_lease("a", 20 * GiB), w.now)
        w.advance(2)
        w.request("b", "B", {G0: 10 * GiB})         # asks while a loads
        w.advance(6)
        w.apply(w.s.ready("a", w.now))              # its load took 8 s
        jobs(w, "a", 1)                             # the request it loaded for
        w.advance(1)
        jobs(w, "a", 0)
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]
        w.advance(1.5)                              # t = 10.5: past 10 s from the grant
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.DRAINING

    def test_a_fresh_engine_whose_load_outlasts_its_turn_waits_for_its_first_request(self):
        """The credit never ends a cold start's turn before its first request can reach it: a
        manager's health poll hands that request over up to a poll after the engine is ready,
        and a front that has reported nothing counts as busy, so no other rule keeps it.
        Failed before: a 12 s load against a 10 s minimum turn left no turn at all, and a was
        drained the instant it said it serves (llama-swap's fresh engine, issue 24)."""
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60,
                                     max_turn_s=0))
        w.s.request(_lease("a", 20 * GiB), w.now)
        w.advance(1)
        w.request("b", "B", {G0: 10 * GiB})         # asks while a loads
        w.advance(11)
        w.apply(w.s.ready("a", w.now))              # its load took 12 s; nothing reported
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.ACTIVE, texts(w)[-1]
        w.advance(1.0)                              # the manager's poll has not come yet
        assert state(w, "a") is S.ACTIVE, texts(w)[-1]
        w.advance(0.6)                              # past the first-request hold (1.5 s)
        assert state(w, "a") is S.DRAINING

    def test_a_wake_keeps_its_whole_turn_against_a_waiter_that_asked_during_it(self):
        """Only a cold start's load counts for the waiter: a wake (here 8 s) keeps the whole
        minimum turn from its report, which is what batches two busy clients; credited, a live
        wake under load (20-30 s) left no turn at all."""
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60,
                                     max_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        jobs(w, "a", 0)
        w.apply(w.s.operator("park", "a", w.now))
        w.do_all()
        assert state(w, "a") is S.PARKED
        w.advance(30)
        w.apply(w.s.wake("a", w.now))
        w.advance(2)
        w.request("b", "B", {G0: 10 * GiB})         # asks while a restores
        w.advance(6)
        w.do_all()                                  # the wake took 8 s
        assert state(w, "a") is S.ACTIVE
        jobs(w, "a", 1)
        w.advance(1)
        jobs(w, "a", 0)
        w.advance(1.5)                              # 10.5 s after the wake began
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]
        w.advance(8)                                # past 10 s from its report
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.PARKING

    def test_a_waiter_that_asked_inside_the_turn_waits_the_whole_turn(self):
        """The other side of the rule: b asks once a serves; a keeps its minimum turn (10 s
        from its ready), which is what batches two busy clients."""
        w = World([24 * GiB], Policy(min_turn_s=10, juggle_window_s=0, wake_limit_s=60,
                                     max_turn_s=0))
        w.s.request(_lease("a", 20 * GiB), w.now)
        w.advance(8)
        w.apply(w.s.ready("a", w.now))
        jobs(w, "a", 1)
        w.advance(1)
        w.request("b", "B", {G0: 10 * GiB})         # asks inside a's turn
        jobs(w, "a", 0)
        w.advance(6.5)                              # t = 15.5: inside 10 s from its ready
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.ACTIVE and "minimum turn" in texts(w)[-1]
        w.advance(3)
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.DRAINING

    def test_a_holder_serving_older_requests_keeps_its_card(self):
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.advance(5)
        w.apply(w.s.jobs("a", 3, w.now, oldest_at=1.0))     # its oldest arrived at t = 1
        w.request("b", "B", {G0: 10 * GiB})                 # b asks at t = 5
        assert state(w, "a") is S.ACTIVE and "older than B's" in texts(w)[-1]
        w.advance(5)
        w.apply(w.s.jobs("a", 2, w.now, oldest_at=7.0))     # what is left came after b
        assert state(w, "a") is S.PARKING


    def test_a_holder_that_holds_newer_requests_is_parked_fenced_at_once(self):
        """Issue 34, the fence: a one-slot holder runs a request older than the waiter's and its
        front holds one that came after. Before, its older request kept the card, and the
        instant it ended the front forwarded the newer one, so the park decided then waited
        for that one too (``bench/policy``'s d and n: an image job of 29 s). Now the park
        begins at once, fenced at the waiter's request: the front forwards only what is older
        than that, and the park waits for the older request alone."""
        from berth.decide.effects import Instruct
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.advance(5)
        w.apply(w.s.jobs("a", 1, w.now, oldest_at=1.0, held=0))   # one request, since t = 1
        w.request("b", "B", {G0: 10 * GiB})                         # b asks at t = 5
        assert state(w, "a") is S.ACTIVE and "older than B's" in texts(w)[-1]
        w.advance(2)
        # A request that came after b's is held at a's front: its one slot is taken.
        w.apply(w.s.jobs("a", 2, w.now, oldest_at=1.0, held=1, oldest_held_at=6.0))
        assert state(w, "a") is S.PARKING
        [park] = [e for e in w.effects if isinstance(e, Instruct) and e.op == "park"]
        assert park.fence_age_s == 2.0 and park.quiet_s, park    # fenced at b's t = 5
        # B's wait names the one request the park waits for, not the one held for after.
        why = w.s.why_waiting("b")
        assert "once its 1 request in flight end" in why, why

    def test_a_higher_priority_waiters_park_is_not_fenced(self):
        """A higher priority goes first, not in arrival order: its park closes the holder's
        front at once and the backlog older than its request stays held (with a fence it went
        before the park: ``tests/broker/test_front_slots.py``)."""
        from berth.decide.effects import Instruct
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.advance(5)
        w.apply(w.s.jobs("a", 3, w.now, oldest_at=1.0, held=2, oldest_held_at=2.0))
        w.request("b", "B", {G0: 10 * GiB}, priority=5)
        assert state(w, "a") is S.PARKING
        [park] = [e for e in w.effects if isinstance(e, Instruct) and e.op == "park"]
        assert park.fence_age_s is None and park.quiet_s, park

    def test_older_requests_keep_the_card_no_longer_than_max_job(self):
        """A job older than its engine's max_job protects nothing: before, the FIFO rule kept a
        holder whose 40 s stream had outlived max_job = 1 s for the whole stream."""
        w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0))
        w.request("a", "A", {G0: 20 * GiB}, park=CKPT)
        w.s.ledger.leases["a"].max_job_s = 5.0
        w.advance(2)
        w.apply(w.s.jobs("a", 1, w.now, oldest_at=1.0))     # one stream, since t = 1
        w.request("b", "B", {G0: 10 * GiB})                 # b asks at t = 2
        assert state(w, "a") is S.ACTIVE and "older than B's" in texts(w)[-1]
        w.advance(5)                                        # the stream is 6 s old: past 5 s
        w.apply(w.s.tick(w.now))
        assert state(w, "a") is S.PARKING


def _lease(lid: str, size: int):
    from berth.decide.model import Lease, Share
    return Lease(lid, lid, {G0: Share(G0, size)})
