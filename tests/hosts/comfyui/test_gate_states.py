"""The gate's states as data (issue 23: a transition table in the house style): every move goes
through ``Gate.move``, which refuses an edge the table lacks."""

from __future__ import annotations

import asyncio
import types

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


def test_a_lease_granted_at_once_holds_prompts_until_its_reservation_is_read():
    """The trigger of tests/hosts/comfyui/test_unfreeable.py's flake: berthd granted the lease
    at once, and a prompt posted while the agent read the reservation found the gate still off
    (which passes everything, unchecked), loaded 11.1 GiB past the 1 GiB lease, and berthd
    extended the lease from a driver read behind the node's back. Failed before: the gate
    moved off -> open only after that read, and stayed off (passing) meanwhile."""
    from berth_hosts.comfyui.agent import Agent
    from berth_hosts.comfyui.states import PASSING

    seen: list[GateState] = []

    async def lease():
        return {"id": "comfyui-1", "state": "active", "cards": [{"pci": "0000:01:00.0"}]}

    async def granted(lid, poll_s):
        seen.append(agent.gate.state)
        return {"granted": True, "policy": {"wait_limit_s": 120}}

    async def read():
        seen.append(agent.gate.state)
        return True

    async def ready(lid):
        return {}

    agent = types.SimpleNamespace(
        gate=Gate(), engine="comfyui", defeated=None, policy={}, health="starting",
        _request_lease=lease, _sync_reservation=read, _follow_wait=lambda w: None,
        _client=types.SimpleNamespace(wait_grant=granted, ready=ready))
    asyncio.run(Agent._register(agent))
    assert seen and not [s for s in seen if s in PASSING], seen
    assert agent.gate.state is G.OPEN
