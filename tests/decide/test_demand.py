"""Issue 34, pure: an idle holder's turn follows a forecast of its demand. Virtual time, no I/O.

One person alternating two models: the holder's last answer went to the very client that now
waits on the other engine, so it yields at once instead of keeping its card for the rent (a
switch back's cost). Two clients taking turns (ping-pong) are not that: the waiter was already
waiting while the holder served. Gaps between a holder's requests forecast the rest; a holder
whose forecasts turn out wrong falls back towards the plain rent (learning-augmented ski
rental, trust λ = ``Policy.demand_trust``). Each test of the first three classes failed before
the change: the idle holder kept its card for the 4 s rent whoever asked.
"""

from __future__ import annotations

import pytest
from berth.decide import demand
from berth.decide.admission import Policy
from berth.decide.model import Capabilities, Lease, ParkMechanism, Share, ShareState
from berth.decide.turns import displaceable, idle_forecast, turn_end

from tests.decide.world import GiB, World, pci_of

S = ShareState
CKPT = ParkMechanism.CHECKPOINT
G0 = pci_of(0)
ME, OTHER = "client-me", "client-other"


def policy(**kw) -> Policy:
    """The default turns (min 10 s, max 30 s, first request 1.5 s) and λ, no juggle guard."""
    return Policy(juggle_window_s=0, **kw)


def state(w: World, lid: str) -> ShareState:
    return w.s.ledger.leases[lid].shares[G0].state


def holder(w: World, load_s: float = 4.0, client: str | None = ME) -> None:
    """a holds the card; its cold start cost ``load_s`` (the rent), it served one request of
    ``client``, answered now."""
    w.s.request(Lease("a", "A", {G0: Share(G0, 14 * GiB)}, caps=Capabilities(
        park=CKPT, front="127.0.0.1:1")), w.now)
    w.read()
    w.advance(load_s)
    w.apply(w.s.ready("a", w.now))
    w.apply(w.s.jobs("a", 1, w.now, w.now, client=client))
    w.advance(0.05)
    w.apply(w.s.jobs("a", 0, w.now, answered_client=client, answered_at=w.now))


def past_min_turn(w: World, client: str | None = ME) -> None:
    """a serves one more request of ``client`` just after its minimum turn (10 s)."""
    w.advance(10.1)
    w.apply(w.s.jobs("a", 1, w.now, w.now, client=client))
    w.advance(0.05)
    w.apply(w.s.jobs("a", 0, w.now, answered_client=client, answered_at=w.now))


def ask(w: World, client: str | None, asked_at: float | None = None) -> None:
    """b asks for the card for a request of ``client`` that arrived at ``asked_at``."""
    lease = Lease("b", "B", {G0: Share(G0, 14 * GiB)},
                  caps=Capabilities(park=CKPT, front="127.0.0.1:2"))
    lease.demand.asked_client = client
    lease.demand.asked_at = w.now if asked_at is None else asked_at
    w.apply(w.s.request(lease, w.now))


class TestCausality:
    def test_the_holder_whose_client_waits_on_the_waiter_yields_at_once(self):
        w = World([24 * GiB], policy())
        holder(w)
        w.advance(0.01)                  # the client got its answer and asks the other model
        ask(w, ME)
        assert state(w, "a") is S.PARKING

    def test_a_drained_runs_new_lease_says_its_client_and_the_holder_yields_at_once(self):
        """A drained run whose front holds a request asks for a new lease, not a wake: the
        request names the client as a wake does. Before, the new lease said nothing, and the
        holder kept its card inside its minimum turn, 'expecting a request within a switch
        back' from the very client now waiting on B (a new user's alternation, 5 s a switch)."""
        w = World([24 * GiB], policy())
        holder(w)
        w.advance(0.01)
        lease = Lease("b", "B", {G0: Share(G0, 14 * GiB)},
                      caps=Capabilities(park=CKPT, front="127.0.0.1:2"))
        w.apply(w.s.request(lease, w.now, client=ME, asked_at=w.now - 0.005))
        assert state(w, "a") is S.PARKING

    def test_a_new_lease_that_names_no_client_keeps_the_turn(self):
        w = World([24 * GiB], policy())
        holder(w)
        w.advance(0.01)
        lease = Lease("b", "B", {G0: Share(G0, 14 * GiB)},
                      caps=Capabilities(park=CKPT, front="127.0.0.1:2"))
        w.apply(w.s.request(lease, w.now))
        assert state(w, "a") is S.ACTIVE

    def test_a_waiter_that_waited_while_the_holder_served_is_ping_pong(self):
        """Not causality (the waiter was already waiting), but its request is older than any
        the idle holder may get: it goes first, as under a FIFO peer (issue 34's yardstick;
        before, the holder kept its card for the rent)."""
        w = World([24 * GiB], policy())
        holder(w)
        past_min_turn(w)
        h = w.s.ledger.leases["a"]
        early = Lease("b", "B", {G0: Share(G0, GiB)})
        early.demand.asked_client, early.demand.asked_at = ME, w.now - 2.0
        assert idle_forecast(h, early, w.s.policy).outlook is demand.Outlook.UNKNOWN
        ask(w, ME, asked_at=w.now - 2.0)   # sent before the holder's answer: another client
        assert state(w, "a") is S.PARKING

    def test_another_clients_request_keeps_the_rent_only_for_a_late_request(self):
        """Another client asks: no causality. The holder expects its own client's request
        0.5 s after its answers; the waiter asked 1 s after: the holder's request was due
        first, so it keeps its card for the rent (its 4 s start); asked before that, the
        waiter's request is the older one and it yields at once."""
        w = World([24 * GiB], policy())
        holder(w)
        w.s.ledger.leases["a"].demand.gaps.extend([0.5] * 3)
        w.advance(1.0)
        ask(w, OTHER)
        assert state(w, "a") is S.ACTIVE
        w.advance(3.2)                   # the plain rent: its 4 s start
        assert state(w, "a") is S.PARKING

    def test_no_client_known_is_no_causality(self):
        w = World([24 * GiB], policy())
        holder(w, client=None)
        past_min_turn(w, None)
        w.advance(0.01)
        h = w.s.ledger.leases["a"]
        waiter = Lease("b", "B", {G0: Share(G0, GiB)})
        waiter.demand.asked_at = w.now
        assert idle_forecast(h, waiter, w.s.policy).outlook is demand.Outlook.UNKNOWN
        ask(w, None)                     # older than any request it may get: it yields
        assert state(w, "a") is S.PARKING
        why = idle_forecast(h, w.s.ledger.leases["b"], w.s.policy, now=w.now).words("A")
        assert why == "A yields at once: B's request is older than any request it may get", why

    def test_the_board_says_why(self):
        w = World([24 * GiB], policy(demand_trust=0.5))
        holder(w)
        w.advance(0.01)
        ask(w, ME)
        # λ = 0.5 would keep it 2 s, but the waiter's request is older than any it may get
        assert state(w, "a") is S.PARKING
        fc = idle_forecast(w.s.ledger.leases["a"], w.s.ledger.leases["b"], w.s.policy)
        assert fc.outlook is demand.Outlook.NONE and fc.keep_s == pytest.approx(2.0)
        assert fc.words("A") == "A yields after 2.00s idle: its client is waiting on B"
        assert demand.Forecast(fc.outlook, fc.why, 4.0, 0.0, 0.0).words("A") == \
            "A yields at once: its client is waiting on B"


class TestTrust:
    def test_trust_yields_after_lambda_times_the_rent_when_the_waiters_age_is_unknown(self):
        """λ·rent for a **no demand** forecast, λ = 1 the plain rent: what the keep is when
        the waiter's request age is not known (with it, an older request ends the keep)."""
        le = Lease("a", "A", {})
        assert demand.forecast(le, None, policy(demand_trust=0.5), 4.0, 30.0).keep_s == 4.0
        le.demand.gaps.extend([20.0, 9.0, 30.0])
        fc = demand.forecast(le, None, policy(demand_trust=0.5), 4.0, 30.0)
        assert fc.outlook is demand.Outlook.NONE and fc.keep_s == pytest.approx(2.0)
        fc = demand.forecast(le, None, policy(demand_trust=1.0), 4.0, 30.0)
        assert fc.keep_s == pytest.approx(4.0)
        w = Lease("b", "B", {})
        fc = demand.forecast(le, w, policy(demand_trust=1.0), 4.0, 30.0, idle_from=10.0,
                             since=10.5)
        assert fc.keep_s == 0.0 and fc.older == "B"

    def test_a_late_demand_keeps_the_rent_and_the_turn_end_brings_the_pass(self):
        w = World([24 * GiB], policy(demand_trust=0.5))
        holder(w)                        # idle from now; its client comes back after 0.5 s
        w.s.ledger.leases["a"].demand.gaps.extend([0.5] * 3)
        idle_from = w.now
        w.now += 1.0
        ask(w, OTHER)
        assert state(w, "a") is S.ACTIVE
        due = w.s.next_due()
        assert due == pytest.approx(idle_from + 4.0, abs=1e-6)
        w.advance(due - w.now)
        assert state(w, "a") is S.PARKING

    def test_a_wrong_forecast_raises_the_holders_lambda_towards_the_plain_rent(self):
        le = Lease("a", "A", {})
        d = le.demand
        demand.yielded(le, demand.Forecast(demand.Outlook.NONE, "", 4.0, 0.0, 0.0), 0.0)
        d.answered_at = 10.0
        d.pending = (10.0, 4.0)
        d.asked_client, d.asked_at = OTHER, 11.0      # its own client came back in 1 s
        d.unsettled = True                            # while another engine held its card
        demand.settle(le, [le])
        assert d.error == pytest.approx(0.5) and d.wrong == 1
        assert demand.trust(le, policy()) == pytest.approx(0.5)
        # a right forecast halves the error again
        d.pending, d.asked_at, d.unsettled = (20.0, 4.0), 30.0, True
        demand.settle(le, [le])
        assert d.error == pytest.approx(0.25) and d.forecasts == 2

    def test_a_client_that_moved_back_is_the_alternation_not_an_error(self):
        a, b = Lease("a", "A", {}), Lease("b", "B", {})
        a.demand.pending = (10.0, 4.0)
        b.demand.answered_client, b.demand.answered_at = ME, 12.0
        a.demand.asked_client, a.demand.asked_at = ME, 12.1    # served on B first, then back
        a.demand.unsettled = True
        demand.settle(a, [a, b])
        assert a.demand.error == 0.0 and a.demand.moved[-1] is True


class TestGaps:
    def test_short_gaps_keep_the_card_for_the_rent(self):
        le = Lease("a", "A", {})
        le.demand.gaps.extend([1.0, 1.2, 0.8])
        fc = demand.forecast(le, None, policy(), 4.0, 30.0)
        assert fc.outlook is demand.Outlook.DEMAND and fc.keep_s == pytest.approx(4.0)
        assert "1.00s idle" in fc.why

    def test_long_gaps_yield_at_once(self):
        le = Lease("a", "A", {})
        le.demand.gaps.extend([20.0, 9.0, 30.0])
        fc = demand.forecast(le, None, policy(), 4.0, 30.0)
        assert fc.outlook is demand.Outlook.NONE and fc.keep_s == 0.0

    def test_two_gaps_are_no_forecast(self):
        le = Lease("a", "A", {})
        le.demand.gaps.extend([20.0, 1.0])
        fc = demand.forecast(le, None, policy(), 4.0, 30.0)
        assert fc.outlook is demand.Outlook.UNKNOWN and fc.keep_s == 4.0

    def test_clients_of_its_own_disable_causality(self):
        a, b = Lease("a", "A", {}), Lease("b", "B", {})
        a.demand.answered_client, a.demand.answered_at = ME, 10.0
        b.demand.asked_client, b.demand.asked_at = ME, 10.1
        assert demand.forecast(a, b, policy(), 4.0, 30.0).outlook is demand.Outlook.NONE
        a.demand.moved.extend([False, False, True])   # most of its requests: its own clients
        assert demand.forecast(a, b, policy(), 4.0, 30.0).outlook is demand.Outlook.UNKNOWN


class TestOwnClients:
    def test_a_request_to_the_holder_from_the_client_it_answered_is_its_own(self):
        """A busy client beside an alternating one, both behind one address (loopback): the
        holder's own client's requests say it has clients of its own, so the alternating
        client's move does not make it yield at once: its own client's request, due 0.95 s
        after its answer, is late and older than the other engine's, so it keeps the rent."""
        w = World([24 * GiB], policy())
        holder(w)
        for _ in range(3):                       # its client comes back, to it
            w.advance(1.0)
            w.apply(w.s.jobs("a", 1, w.now, w.now, client=ME))
            w.advance(0.05)
            w.apply(w.s.jobs("a", 0, w.now, answered_client=ME, answered_at=w.now))
        assert list(w.s.ledger.leases["a"].demand.moved) == [False, False, False]
        w.advance(1.2)
        ask(w, ME)                               # the same address asks the other engine
        assert state(w, "a") is S.ACTIVE


class TestTurnEnd:
    @pytest.mark.parametrize("client,trust,gap", [(ME, 0.0, None), (ME, 0.5, None),
                                                  (OTHER, 0.0, None), (OTHER, 0.0, 0.005),
                                                  (OTHER, 0.5, 0.005), (OTHER, 0.0, 1.0)])
    def test_the_turn_ends_where_the_ladder_stops_keeping_it(self, client, trust, gap):
        """``turn_end`` with the waiter follows ``_turn`` for the forecast's keep (``gap``:
        its clients' idle gaps, a demand forecast due before or after the waiter asked)."""
        w = World([24 * GiB], policy(demand_trust=trust))
        holder(w)
        h = w.s.ledger.leases["a"]
        if gap is not None:
            h.demand.gaps.extend([gap] * 3)
        waiter = Lease("b", "B", {G0: Share(G0, GiB)})
        waiter.demand.asked_client, waiter.demand.asked_at = client, w.now + 0.01
        now = w.now + 0.01
        end = turn_end(h, w.s.policy, now, waiter)
        if end is None:
            assert displaceable(h, waiter, w.s.policy, now) is None
            return
        assert displaceable(h, waiter, w.s.policy, end - 0.01) is not None
        assert displaceable(h, waiter, w.s.policy, end + 0.01) is None



class TestAMovingClientsTurn:
    """Issue 34, third pass: the minimum turn protects a holder against a waiter that can
    batch, not against one whose request came from a client that moves between engines
    (``bench/policy``'s m: a busy client on A beside a client alternating A and B; B's
    request waited A's turn, 12.8-16.5 s at p95 against llama-swap's 11.5-12.4 s). Both tests
    of the turn failed before: A kept its card for its minimum turn."""

    MOVER = "client-mover"

    def busy_beside(self, w: World) -> None:
        """a holds; it answers the mover, then its busy client (its last answer), and is idle
        between two of that client's requests, well inside its minimum turn (10 s)."""
        holder(w)                                    # a's own (busy) client: ME
        w.advance(0.5)
        w.apply(w.s.jobs("a", 1, w.now, w.now, client=self.MOVER))
        w.advance(0.05)
        w.apply(w.s.jobs("a", 1, w.now, w.now, client=ME, answered_client=self.MOVER,
                         answered_at=w.now))
        w.advance(0.05)
        w.apply(w.s.jobs("a", 0, w.now, answered_client=ME, answered_at=w.now))

    def test_the_last_answer_to_each_client_is_kept(self):
        """Beside a busy client the holder's last answer went to that client; the mover's
        answer is still known, so its next request is known to have moved."""
        w = World([24 * GiB], policy())
        self.busy_beside(w)
        a = w.s.ledger.leases["a"]
        assert a.demand.answered_client == ME
        b = Lease("b", "B", {G0: Share(G0, GiB)})
        assert demand.moved_from([a, b], b, self.MOVER, w.now) is True
        assert demand.moved_from([a, b], b, "client-new", w.now) is None

    def test_the_minimum_turn_does_not_keep_the_card_from_a_moving_client(self):
        w = World([24 * GiB], policy())
        self.busy_beside(w)
        w.advance(0.01)
        ask(w, None)                       # the run's lease request names no client ...
        w.apply(w.s.wake("b", w.now, self.MOVER, w.now))      # ... its front does
        h, b = w.s.ledger.leases["a"], w.s.ledger.leases["b"]
        assert b.demand.asked_moved is True
        assert displaceable(h, b, w.s.policy, w.now) is None
        assert turn_end(h, w.s.policy, w.now, b) is None

    def test_a_waiter_with_clients_of_its_own_still_waits_the_turn(self):
        """Two busy clients (ping-pong): the waiter's client is its own, so the turn batches
        its requests and keeps the card, as before."""
        w = World([24 * GiB], policy())
        self.busy_beside(w)
        w.advance(0.01)
        ask(w, OTHER)
        h, b = w.s.ledger.leases["a"], w.s.ledger.leases["b"]
        b.demand.moved.extend([False] * 3)
        why = "A is inside its minimum turn and expects a request within a switch back (4.00s)"
        assert displaceable(h, b, w.s.policy, w.now) == why
        b.demand.moved.clear()
        b.demand.asked_moved = None        # not known: the turn keeps it too
        assert displaceable(h, b, w.s.policy, w.now) == why
