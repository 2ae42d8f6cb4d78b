"""Issue 24, pure: decisions that hold under live contention. Virtual time, no I/O.

Rent or buy (an idle holder keeps its card while it has been idle less than a switch back would
cost, within ``max_turn``, and since issue 34 only for a request due before the waiter asked; a
holder that has just become ready waits ``first_request_s`` for its first request), room re-decided at grant (the best waiter then, not the one it was made for), a
park called off when its waiter leaves before the mechanism began, memory a gone process left
behind counted as a release under way, and a holder that Berth can neither drain nor park
named at once. Each failed before the change (the idle holder yielded at once, the room went
to the waiter it was made for, the park ran on, the wait was said to be lasting, the drain was
planned and the host was said to have exited).
"""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.effects import Instruct, Note
from berth.decide.model import Capabilities, Lease, ParkMechanism, Share, ShareState

from tests.decide.world import GiB, World, pci_of

S = ShareState
CKPT = ParkMechanism.CHECKPOINT
G0 = pci_of(0)


def state(w: World, lid: str) -> ShareState:
    return w.s.ledger.leases[lid].shares[G0].state


def jobs(w: World, lid: str, n: int) -> None:
    w.apply(w.s.jobs(lid, n, w.now))


def turns(**kw) -> Policy:
    """The default turns (min 10 s, max 30 s, first request 1.5 s), no juggle guard."""
    return Policy(juggle_window_s=0, **kw)


def two(w: World, load_s: float = 4.0) -> None:
    """a holds the card, b asks for it; a's cold start cost ``load_s`` and it has served."""
    w.s.request(Lease("a", "A", {G0: Share(G0, 14 * GiB)}, caps=Capabilities(
        park=CKPT, front="127.0.0.1:1")), w.now)
    w.read()
    w.advance(load_s)
    w.apply(w.s.ready("a", w.now))
    jobs(w, "a", 1)
    jobs(w, "a", 0)


def expects(w: World, lid: str = "a", gap_s: float = 0.5) -> None:
    """``lid``'s clients came back ``gap_s`` after each of its last three answers: a demand
    forecast, its next request due ``gap_s`` after it went idle (issue 34)."""
    w.s.ledger.leases[lid].demand.gaps.extend([gap_s] * 3)


def past_min_turn(w: World, lid: str = "a") -> None:
    """``lid`` serves one more request just after its minimum turn (10 s) and is idle again."""
    w.advance(10.1)
    jobs(w, lid, 1)
    jobs(w, lid, 0)


class TestRentOrBuy:
    def test_an_idle_holder_yields_at_once_to_an_older_request(self):
        """Issue 34: past its minimum turn, idle, the holder has no request older than the
        waiter's (FIFO peers serve the waiter now). Before: it kept its card for the rent, its
        4 s start. Inside its minimum turn it keeps it for the demand it may have."""
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.ACTIVE
        why, _ = w.s.wait_cause("b")
        assert "inside its minimum turn and expects a request" in why, why
        w.advance(4.1)                          # idle past the rent: it yields
        assert state(w, "a") is S.PARKING

    def test_past_its_minimum_turn_it_yields_at_once(self):
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)
        past_min_turn(w)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.PARKING

    def test_a_late_expected_request_keeps_the_card_for_the_rent(self):
        """Its request was due before the waiter asked (its client is late, not gone): it is
        the older one, and the holder keeps its card while idle less than a switch back."""
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)                      # a switch back would cost its 4 s start
        past_min_turn(w)
        expects(w, gap_s=0.5)
        w.advance(1.0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.ACTIVE
        why, lasting = w.s.wait_cause("b")
        assert "request expected within a switch back" in why and not lasting, why
        w.advance(2.9)
        assert state(w, "a") is S.ACTIVE
        w.advance(0.2)                          # idle 4.1 s > 4 s: it yields
        assert state(w, "a") is S.PARKING

    def test_an_expected_request_not_yet_due_is_younger_than_the_waiters(self):
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)
        past_min_turn(w)
        expects(w, gap_s=2.0)
        w.advance(1.0)                          # due in 1 s; the waiter asks now
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.PARKING

    def test_its_own_clients_next_request_does_not_renew_the_keep(self):
        """A busy client that comes back within the rent kept the card against an older waiter
        up to ``max_turn`` (30 s) before issue 34's yardstick; now its next idle spell starts
        after the waiter asked, so the waiter's request is the older one."""
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)
        past_min_turn(w)
        expects(w, gap_s=0.5)
        w.advance(1.0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.ACTIVE
        w.advance(1.0)
        jobs(w, "a", 1)                         # its client came back: served first
        assert state(w, "a") is S.ACTIVE
        jobs(w, "a", 0)
        assert state(w, "a") is S.PARKING

    def test_a_busy_holder_serves_its_turn_then_yields(self):
        w = World([24 * GiB], turns(max_turn_s=20))
        two(w, load_s=4.0)
        jobs(w, "a", 1)                         # busy with a request newer than b's? not yet
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.advance(12)                           # past min_turn, inside max_turn
        w.apply(w.s.jobs("a", 1, w.now, oldest_at=w.now))   # a newer request than b's
        assert state(w, "a") is S.ACTIVE
        why, _ = w.s.wait_cause("b")
        assert "serves its turn" in why, why
        w.advance(9)
        assert state(w, "a") is S.PARKING

    def test_a_higher_priority_holders_rent_is_its_keep_warm(self):
        w = World([24 * GiB], turns())
        two(w, load_s=20.0)
        w.s.ledger.leases["a"].priority = 5
        w.s.ledger.leases["a"].keep_warm_s = 2.0
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        w.advance(2.5)                          # past keep_warm, well inside a 20 s rent
        assert state(w, "a") is S.PARKING


class TestFirstRequest:
    def test_a_fresh_engine_waits_for_its_first_request(self):
        """Under llama-swap the request is still inside llama-swap (its health poll every
        1 s) when the engine says it serves: it must not be drained for being idle."""
        w = World([24 * GiB], turns())
        w.request("a", "A", {G0: 14 * GiB})     # no park: it would be drained
        jobs(w, "a", 0)
        w.request("b", "B", {G0: 14 * GiB})
        assert state(w, "a") is S.ACTIVE
        why, lasting = w.s.wait_cause("b")
        assert "first request" in why and not lasting, why
        w.advance(1.0)                          # llama-swap's poll forwards it
        jobs(w, "a", 1)
        assert state(w, "a") is S.ACTIVE
        jobs(w, "a", 0)                         # served; its cold start (0 s here) is its rent
        assert state(w, "a") is S.DRAINING

    def test_a_request_served_between_two_samples_ends_the_first_request_hold(self):
        """A small model answers in a few ms, between two of the front's in-flight samples: the
        front's count of requests served moved while in-flight stayed 0. The holder is not kept
        for a first request it already served (before the count, it kept its card the whole
        ``first_request_s`` after the answer), and its idle spell starts at that request."""
        w = World([24 * GiB], turns(first_request_s=30))
        w.request("a", "A", {G0: 14 * GiB})     # no park: it would be drained; ready at once
        jobs(w, "a", 0)
        w.request("b", "B", {G0: 14 * GiB})
        assert state(w, "a") is S.ACTIVE
        assert "first request" in w.s.wait_cause("b")[0]
        w.advance(0.5)
        w.apply(w.s.jobs("a", 0, w.now, served=1))   # in flight 0 before and after
        assert state(w, "a") is S.DRAINING        # its rent (a 0 s start) is over at once
        assert [e.kind for e in w.effects if isinstance(e, Note)].count("first_request") == 1

    def test_a_first_request_is_noted_with_no_waiter_queued(self):
        """The timeline says when each turn's first request came, a waiter queued or not: a
        waiter that asks after it reads that the hold for one is over (seen with the real
        llama-swap: the holder served its request before the other model's run asked, no
        note was written, and its drain could not be told from one before its request)."""
        w = World([24 * GiB], turns())
        w.request("a", "A", {G0: 14 * GiB})
        jobs(w, "a", 0)
        w.advance(0.5)
        jobs(w, "a", 1)
        jobs(w, "a", 0)
        notes = [e for e in w.effects if isinstance(e, Note) and e.kind == "first_request"]
        assert len(notes) == 1 and "500ms after it said it serves" in notes[0].text, notes
        w.advance(0.5)
        jobs(w, "a", 1)                         # a second request of the same turn: no note
        assert [e.kind for e in w.effects if isinstance(e, Note)].count("first_request") == 1

    def test_a_request_served_unseen_ends_the_keep_against_an_older_waiter(self):
        """A request served between two in-flight samples (the front's served count moved) is
        the end of an idle spell like any other: the waiter's request is older than the next
        one, so the holder yields then."""
        w = World([24 * GiB], turns())
        two(w, load_s=4.0)
        past_min_turn(w)
        expects(w, gap_s=0.5)
        w.advance(1.0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.ACTIVE        # its late request is older than b's
        w.advance(1.0)
        w.apply(w.s.jobs("a", 0, w.now, served=1))   # served unseen by the samples
        assert state(w, "a") is S.PARKING

    def test_a_negative_served_count_is_refused(self):
        w = World([24 * GiB], turns())
        w.request("a", "A", {G0: 14 * GiB})
        try:
            w.s.jobs("a", 0, w.now, served=-1)
        except ValueError as e:
            assert "served" in str(e) and "-1" in str(e)
        else:
            raise AssertionError("a negative count was taken")

    def test_no_request_within_first_request_s_yields(self):
        w = World([24 * GiB], turns(first_request_s=1.5))
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        jobs(w, "a", 0)
        w.request("b", "B", {G0: 14 * GiB})
        w.advance(1.6)
        assert state(w, "a") is S.PARKING


class TestRoomAtGrant:
    def test_room_made_for_m_goes_to_h_who_asked_later_with_higher_priority(self):
        w = World([24 * GiB])
        w.request("l", "L", {G0: 14 * GiB}, park=CKPT)
        jobs(w, "l", 1)                          # L serves a long job
        w.request("m", "M", {G0: 14 * GiB}, priority=5, park=CKPT)
        assert [p.op for p in w.pending] == ["park"]      # L parks once its job ends
        w.advance(5)
        w.request("h", "H", {G0: 14 * GiB}, priority=10, park=CKPT)
        assert w.s.ledger.leases["h"].is_waiting()
        jobs(w, "l", 0)
        w.do_all()
        assert state(w, "h") is S.ACTIVE and state(w, "m") is S.WAITING
        assert w.granted_order[-1] == "h"
        why, _ = w.s.wait_cause("m")
        assert "H" in why and "higher priority" in why, why
        assert not w.s.ledger.earmarks, w.s.ledger.earmarks

    def test_an_equal_priority_latecomer_does_not_take_the_room(self):
        w = World([24 * GiB])
        w.request("l", "L", {G0: 14 * GiB}, park=CKPT)
        w.request("m", "M", {G0: 14 * GiB}, priority=5, park=CKPT)
        w.advance(1)
        w.request("x", "X", {G0: 14 * GiB}, priority=5, park=CKPT)
        w.do_all()
        assert w.granted_order.index("m") < w.granted_order.index("x"), w.granted_order


class TestCallOff:
    def _parking_for_b(self) -> World:
        w = World([24 * GiB])
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        jobs(w, "b", 0)
        w.request("a", "A", {G0: 14 * GiB}, park=CKPT)
        w.do_all()                               # b parked for a
        assert state(w, "b") is S.PARKED
        w.apply(w.s.jobs("a", 1, w.now, oldest_at=w.now))
        w.advance(1)
        w.apply(w.s.wake("b", w.now))           # b's client asks; a's job is older: it stays
        assert state(w, "a") is S.ACTIVE
        w.advance(1)
        w.apply(w.s.jobs("a", 1, w.now, oldest_at=w.now))   # a job that came after b asked
        assert state(w, "a") is S.PARKING       # its park waits for that job
        return w

    def test_a_park_whose_mechanism_has_not_begun_is_called_off(self):
        w = self._parking_for_b()
        w.apply(w.s.unwake("b", w.now))         # b's client left
        off = [e for e in w.effects if isinstance(e, Instruct) and e.call_off]
        assert [(e.lease_id, e.op) for e in off] == [("a", "wake")]
        w.do(len(w.pending) - 1)               # the run calls the park off: it had not begun
        assert state(w, "a") is S.ACTIVE and state(w, "b") is S.PARKED
        assert not [p for p in w.pending if p.op == "park"]

    def test_a_park_another_waiter_wants_runs_on(self):
        w = self._parking_for_b()
        w.request("c", "C", {G0: 14 * GiB}, park=CKPT)
        w.apply(w.s.unwake("b", w.now))
        assert not [e for e in w.effects if isinstance(e, Instruct) and e.call_off]


class TestReleaseUnderWay:
    def test_memory_a_gone_pid_left_is_a_release_under_way_not_a_lasting_cause(self):
        """The driver dropped the exited PID before freeing its memory (real drivers do): the
        waiter must wait for it, not hear at once that nothing can change."""
        w = World([24 * GiB], reserve=GiB)
        w.request("a", "A", {G0: 14 * GiB})
        w.exit("a")
        ghost = w.used.pop(("a", G0))           # its PID is gone, its bytes are not
        w.stowaway += 0
        w.baseline += ghost
        w.confirm_all()
        assert "a" in w.ended
        w.request("b", "B", {G0: 14 * GiB})
        why, lasting = w.s.wait_cause("b")
        assert "left with its process" in why and not lasting, why
        w.baseline -= ghost                     # the driver frees it
        w.read()
        assert state(w, "b") is S.ACTIVE


class TestUnfreeable:
    def _comfy(self, w: World, park: ParkMechanism | None, no_park: str | None = None) -> None:
        lease = Lease("c", "comfyui", {G0: Share(G0, 12 * GiB)}, caps=Capabilities(
            park=park, front="comfyui-node", drain=False, no_park=no_park))
        w.apply(w.s.request(lease, w.now))
        jobs(w, "c", 0)

    def test_a_host_without_park_that_berth_never_stops_is_named_at_once(self):
        w = World([24 * GiB], reserve=GiB)
        self._comfy(w, None, "ComfyUI runs with --highvram: unloading frees nothing")
        w.request("llm", "llm", {G0: 14 * GiB}, park=CKPT)
        why, lasting = w.s.wait_cause("llm")
        assert lasting and "comfyui" in why and "--highvram" in why, why
        assert not w.pending                    # no drain planned for it
        assert w.s.ledger.leases["llm"].is_waiting()

    def test_a_park_that_frees_nothing_keeps_the_card_and_is_named_next_time(self):
        w = World([24 * GiB], reserve=GiB)
        self._comfy(w, ParkMechanism.HOOK)
        w.request("llm", "llm", {G0: 14 * GiB}, park=CKPT)
        assert [p.op for p in w.pending] == ["park"]
        w.do(0, frees=False)                    # the node unloads; nothing leaves the card
        w.advance(w.s.policy.release_grace_s + 1)
        assert state(w, "c") is S.ACTIVE and w.s.counters.drains == 0
        assert any(isinstance(e, Note) and e.kind == "keep" for e in w.effects)
        why, lasting = w.s.wait_cause("llm")
        assert lasting and "its park freed nothing" in why, why

    def test_the_ladder_never_plans_a_drain_of_a_host_berth_never_stops(self):
        w = World([24 * GiB], reserve=GiB, policy=Policy(min_turn_s=0, juggle_window_s=0,
                                                          max_turn_s=0, first_request_s=0))
        w.s.ledger.ram_budget_bytes = 0          # no host RAM for its park
        self._comfy(w, ParkMechanism.HOOK)
        w.request("llm", "llm", {G0: 14 * GiB}, park=CKPT)
        assert not w.pending and w.s.counters.drains == 0
        why, lasting = w.s.wait_cause("llm")
        assert "can only park" in why and not lasting, why

    def test_its_lease_ending_never_says_it_exited(self):
        w = World([24 * GiB])
        self._comfy(w, ParkMechanism.HOOK)
        w.apply(w.s.exited("c", w.now, final=True))
        texts = [e.text for e in w.effects if isinstance(e, Note) and e.kind == "exit"]
        assert texts and not any(t.endswith("exited") for t in texts), texts


class TestStarting:
    def test_a_starting_engine_keeps_its_card_against_a_waiter_that_asked_later(self):
        """Issue 34 (bench/policy's n and o shapes): an engine still loading for its request
        (held in llama-swap until its health poll, so its front reports none) is not parked
        for a waiter that asked after that request; it serves it first. Before: the park was
        planned at once and took effect before its first request, which waited 57 s."""
        w = World([24 * GiB], turns())
        w.s.request(Lease("a", "A", {G0: Share(G0, 14 * GiB)}, caps=Capabilities(
            park=CKPT, front="127.0.0.1:1")), w.now)
        w.read()
        jobs(w, "a", 0)                         # its front has nothing yet
        w.advance(5.0)
        w.request("b", "B", {G0: 14 * GiB}, park=CKPT)
        assert state(w, "a") is S.ACTIVE
        why, lasting = w.s.wait_cause("b")
        assert "A is starting" in why and not lasting, why
        w.advance(4.0)
        w.apply(w.s.ready("a", w.now))          # it serves: its first request comes next
        assert state(w, "a") is S.ACTIVE
        w.advance(0.5)
        jobs(w, "a", 1)
        jobs(w, "a", 0)
        w.advance(10.0)                         # its minimum turn, then idle past the rent
        assert state(w, "a") is S.PARKING

    def test_a_waiter_older_than_the_starting_engines_request_is_not_held_back(self):
        w = World([24 * GiB], turns())
        w.request("b", "B", {G0: 20 * GiB}, park=CKPT)   # b waits from now (no room yet)
        lease = Lease("a", "A", {G0: Share(G0, 14 * GiB)}, caps=Capabilities(
            park=CKPT, front="127.0.0.1:1"))
        lease.requested_at = w.now + 1.0
        from berth.decide.turns import displaceable
        lease.granted_at, lease.jobs_reported = w.now + 1.0, True
        since = w.now
        assert displaceable(lease, w.s.ledger.leases["b"], turns(), w.now + 2.0,
                            since=since) is None
        assert "is starting" in displaceable(lease, w.s.ledger.leases["b"], turns(),
                                             w.now + 2.0, since=since + 1.5)
