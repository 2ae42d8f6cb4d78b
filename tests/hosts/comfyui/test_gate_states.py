"""The gate's states as data (issue 23: a transition table in the house style): every move goes
through ``Gate.move``, which refuses an edge the table lacks."""

from __future__ import annotations

import pytest
from berth_hosts.comfyui.gate import Gate
from berth_hosts.comfyui.states import EDGES, TRANSITIONS, GateState, IllegalGateTransition

G = GateState


def test_every_state_is_reachable_from_off_and_stopped_is_the_only_end():
    seen, todo = {G.OFF}, [G.OFF]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(GateState)
    assert [s for s in GateState if not TRANSITIONS[s]] == [G.STOPPED]
    assert all(why for why in EDGES.values())


def test_a_move_checks_its_edge_and_stamps_the_time():
    g = Gate()
    since = g.since
    assert g.move(G.STARTING, "registered") is True and g.state is G.STARTING
    assert g.since >= since
    assert g.move(G.STARTING) is False                      # already there: nothing happens
    with pytest.raises(IllegalGateTransition, match="starting -> asleep is not allowed"):
        g.move(G.ASLEEP)
    assert g.state is G.STARTING


def test_only_from_is_checked_under_the_lock_and_a_drained_gate_stays_stopped():
    g = Gate()
    g.move(G.OPEN)
    assert g.move(G.WAKING, only_from=frozenset({G.ASLEEP})) is False
    assert g.state is G.OPEN
    g.stop("drained by Berth")
    assert g.fail_open("berthd is not reachable") is False and g.state is G.STOPPED
    assert g.counters()["state"] == "stopped"
