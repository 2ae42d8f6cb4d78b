"""The gate's states and edges, as data (STYLE.md "states as data"; the front's ``rules.py``).

Source: seed 002 "Fronts" (open, closing, asleep, waking); issue 13 (``starting`` while the lease
waits, ``off`` when the gate passes everything); issue 23 ("transition tables for the two other
front-like state machines"). Depends on nothing, so any module may read it.

::

    off ──▶ starting ──▶ open ──▶ closing ──▶ asleep ──▶ waking ──▶ open
     │                    ▲          │           │
     │                    └──────────┘ called off└──▶ open (woken without a held prompt)
     └──▶ open / asleep (berthd back, keeping the lease)
    any ──▶ off (fail-open; not from stopped)       any ──▶ stopped (drained)
"""

from __future__ import annotations

import enum

__all__ = ["GateState", "EDGES", "TRANSITIONS", "HOLDING", "PASSING", "IllegalGateTransition"]


class GateState(enum.StrEnum):
    """The gate's states: the seed's four, ``starting`` while the lease waits for its grant,
    ``off`` while the gate passes everything (berthd down, no lease: fail-open, as ``berth
    run``), ``stopped`` after a drain (every prompt gets a 503 until ComfyUI restarts)."""

    OFF = "off"
    STARTING = "starting"
    OPEN = "open"
    CLOSING = "closing"
    ASLEEP = "asleep"
    WAKING = "waking"
    STOPPED = "stopped"


G = GateState

_FAIL_OPEN = ("fail-open: berthd is not reachable, refused the lease, or the agent failed; "
              "prompts pass unchecked")
_DRAINED = ("drained: Berth cannot stop ComfyUI (rule 6), so prompts get a 503 until ComfyUI "
            "restarts")

#: Every legal transition, labelled with why it is taken.
EDGES: dict[tuple[GateState, GateState], str] = {
    (G.OFF, G.STARTING): "registered; the lease waits for room",
    (G.OFF, G.OPEN): "the lease was granted, or berthd is back and keeps it active",
    (G.OFF, G.ASLEEP): "berthd is back and keeps the lease parked: a prompt asks for the wake",
    (G.OFF, G.CLOSING): "a park asked on the engine protocol's route while unleased",
    (G.STARTING, G.OPEN): "the lease was granted",
    **{(s, G.STARTING): "the lease ended; the new one waits for room"
       for s in (G.OPEN, G.CLOSING, G.ASLEEP, G.WAKING)},
    (G.OPEN, G.CLOSING): "a park or drain begins: the queue goes idle first (rule 3)",
    (G.CLOSING, G.ASLEEP): "the queue went idle and the worker unloaded the models",
    (G.CLOSING, G.OPEN): "the park was called off (the queue stayed busy) or a wake came first",
    (G.ASLEEP, G.WAKING): "a prompt arrived: berthd is asked for the wake",
    (G.ASLEEP, G.OPEN): "woken without a held prompt (berthd resumed the lease)",
    (G.WAKING, G.OPEN): "the wake answered",
    (G.WAKING, G.ASLEEP): "the wake could not be asked, or every prompt that asked for it "
                          "has gone (it is withdrawn); the next prompt asks again",
    **{(s, G.OFF): _FAIL_OPEN for s in GateState if s not in (G.OFF, G.STOPPED)},
    **{(s, G.STOPPED): _DRAINED for s in GateState if s is not G.STOPPED},
}

#: Allowed next states, by state.
TRANSITIONS: dict[GateState, frozenset[GateState]] = {
    st: frozenset(b for (a, b) in EDGES if a == st) for st in GateState
}

#: States in which a gated write is held (not passed, not refused).
HOLDING = frozenset({G.STARTING, G.CLOSING, G.ASLEEP, G.WAKING})

#: States in which a gated write passes (``open`` after the growth check).
PASSING = frozenset({G.OFF, G.OPEN})


class IllegalGateTransition(RuntimeError):
    """A state change that :data:`TRANSITIONS` does not allow."""
