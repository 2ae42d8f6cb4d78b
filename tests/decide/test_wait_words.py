"""The words of a wait are true (issue 16 follow-up): a holder that has not said it serves is
*starting*, not "inside its minimum turn" (even with a minimum turn of 0 s), and a holder whose
front never reported its requests is not said to have 0 of them (it counts as busy). Pure:
virtual time, no I/O."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.causes import holder_words
from berth.decide.model import Capabilities, Lease, ParkMechanism, Share
from berth.decide.turns import displaceable

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)


def _lease(lid: str, **kw) -> Lease:
    return Lease(lid, lid.upper(), {G0: Share(G0, 10 * GiB)}, **kw)


def test_a_holder_that_has_not_said_it_serves_is_starting_even_with_no_minimum_turn():
    policy = Policy(min_turn_s=0, wake_limit_s=60)
    holder, waiter = _lease("a", granted_at=0.0), _lease("b")
    why = displaceable(holder, waiter, policy, now=5.0)
    assert why is not None and "A is starting" in why and "minimum turn" not in why, why
    assert "1.0m" in why or "60" in why, why            # how long it is given: the wake limit
    # Past the wake limit with no turn to serve, it may be displaced.
    assert displaceable(holder, waiter, policy, now=61.0) is None


def test_a_holder_serving_inside_its_turn_is_inside_its_minimum_turn():
    policy = Policy(min_turn_s=30, wake_limit_s=60)
    holder = _lease("a", granted_at=0.0, ready_at=1.0)
    why = displaceable(holder, _lease("b"), policy, now=5.0)
    assert why == "A is inside its minimum turn", why


def test_a_holder_that_never_reported_its_requests_is_not_said_to_have_none():
    quiet = _lease("a")
    assert "nothing reports them" in holder_words(quiet) and "0 requests" not in holder_words(quiet)
    told = _lease("a", jobs_reported=True)
    assert "0 requests in flight" in holder_words(told)


def test_the_wait_names_what_was_reported_and_nothing_else():
    w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0))
    w.request("a", "A", {G0: 20 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.request("b", "B", {G0: 10 * GiB})
    why, lasting = w.s.wait_cause("b")
    assert "A (priority 0, requests in flight unknown: its front has not reported them yet, " \
        "so it counts as busy)" in why, why
    assert "0 requests in flight" not in why and "minimum turn" in why and not lasting, why
    w.apply(w.s.jobs("a", 2, w.now))
    w.advance(1)                                # the next pass says the count it was told
    why, _ = w.s.wait_cause("b")
    assert "A (priority 0, 2 requests in flight)" in why, why


def test_a_waiter_queued_behind_another_names_what_holds_the_card():
    # Issue 37 (found under supervisord's autostart): the second waiter was told only "queued
    # behind B for the same card", naming neither the holder nor what is being done for it.
    w = World([24 * GiB], Policy(min_turn_s=0, juggle_window_s=0))
    w.request("a", "A", {G0: 20 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.advance(30)
    w.request("b", "B", {G0: 10 * GiB})
    w.request("c", "C", {G0: 10 * GiB})
    head, _ = w.s.wait_cause("b")
    why, _ = w.s.wait_cause("c")
    assert head and why == f"queued behind B for the same card (B: {head})", (head, why)
    assert "A" in head, head


def test_a_holder_with_a_front_that_has_not_reported_yet_is_not_said_to_have_none():
    """After a berthd restart a re-attached run's front has not reported its requests yet: the
    wait said ``nothing reports them (no front)`` of an engine behind ``--front``. It says its
    front has not reported them yet; "no front" stays for a holder without one."""
    fronted = _lease("a", caps=Capabilities(front="127.0.0.1:5800"))
    said = holder_words(fronted)
    assert "its front has not reported them yet" in said and "no front" not in said, said
    assert "counts as busy" in said, said
    assert "(no front)" in holder_words(_lease("a"))
