"""The move rung, planned: which holders to move to another card so that a waiter fits without a
park or a drain.

Source: issue 35 ("Move: an engine changes cards inside one run"). Pure: no I/O, no clock, no
logging; time is an argument.

:func:`move_block` says why a holder may never move (``berth status``'s ``move.why``):

1. its command pins its card (:attr:`~.model.Capabilities.pinned`, found by ``berth run``);
2. its size names its card (``--size 14GiB@gpu0``: a named card is never changed);
3. it has no front of its own (a host's program: nothing holds its requests while it restarts);
4. Berth cannot stop and start it (an in-process host);
5. it spans several cards (a move of one share of a multi-card engine is not planned).

:func:`plan_moves` is the bounded search: for a waiter that needs ``need`` bytes on one card, it
tries every card X the waiter could go on, and moves off X the fewest, cheapest holders that fit
now on another card Y (each by its measured cost: a restore onto Y where the tool restores across
cards, else a restart, :attr:`~.model.Lease.switch_cost_s`), single moves first, then pairs
(at most :data:`MAX_MOVES` holders, over at most :data:`MAX_SETS` candidate sets). The caller
compares the plan's cost with the ladder's own (a park's or a drain's) and moves only when it is
cheaper for everyone waiting; with no waiter it is never called, so nothing moves (no churn).
What a moved holder takes on Y is its reservation there, so the plan never overlaps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .ledger import Ledger, counted_bytes
from .model import Lease, ShareState

__all__ = ["Move", "MovePlan", "move_block", "plan_moves", "MAX_MOVES", "MAX_SETS"]

S = ShareState

#: The most holders one plan moves.
MAX_MOVES = 2
#: The most candidate sets of holders scored for one card.
MAX_SETS = 64
#: Fronts that are not a run's own (a gateway, ComfyUI's port): nothing there restarts an engine.
_SHARED_FRONTS = ("gateway", "comfyui-port")


@dataclass(frozen=True)
class Move:
    """One holder moving: ``lease_id`` (``engine``) from card ``src`` to ``dst`` (PCI
    addresses), ``frees_bytes`` what leaves ``src``, ``takes_bytes`` what it reserves on
    ``dst``, ``cost_s`` its measured cost (seconds), ``how`` ``"restore"`` or ``"restart"``."""

    lease_id: str
    engine: str
    src: str
    dst: str
    frees_bytes: int
    takes_bytes: int
    cost_s: float
    how: str


@dataclass(frozen=True)
class MovePlan:
    """Moves that let the waiter fit on ``card`` with nothing parked or drained; ``cost_s`` is
    their sum (seconds)."""

    waiter: str
    card: str
    moves: tuple[Move, ...]
    cost_s: float

    def why(self, ledger: Ledger) -> str:
        """The plan in words, for the timeline and the board."""
        name = ledger.cards[self.card].name
        parts = [f"{m.engine} {ledger.cards[m.src].name}→{ledger.cards[m.dst].name} "
                 f"({m.how})" for m in self.moves]
        return f"making room on {name} by moving {', '.join(parts)}"


def move_block(lease: Lease) -> str | None:
    """Why ``lease`` may never move to another card (steps 1-5 of the module's rule), in
    words, or ``None`` when it may."""
    if lease.caps.pinned:                                                       # (1)
        return f"never moved: {lease.caps.pinned}"
    if any(p not in lease.movable for p in lease.shares):                       # (2)
        return "never moved: its size names its card"
    front = lease.caps.front
    if not front or front in _SHARED_FRONTS:                                    # (3)
        return "never moved: it has no front of its own to hold its requests while it restarts"
    if not lease.caps.drain:                                                    # (4)
        return "never moved: Berth cannot stop and start it"
    if len(lease.shares) != 1:                                                  # (5)
        return "never moved: it spans several cards"
    return None


def plan_moves(ledger: Ledger, waiter: str, need: int, cards: list[str], now: float,
               restore_across: bool = False, protected: frozenset[str] = frozenset()
               ) -> MovePlan | None:
    """The cheapest :class:`MovePlan` that lets ``waiter`` (lease id) reserve ``need`` bytes on
    one of ``cards`` (PCI addresses it may go on), or ``None``. ``protected``: lease ids the
    ladder keeps where they are now (a hold, a turn, a higher priority: the caller's
    ``displaceable``); a move still restarts the engine, so it is asked the same. ``now`` is
    the broker's clock (seconds; unused by the search itself, kept for the caller's deadlines).
    ``restore_across``: the checkpoint tool restores onto another card (driver 580+), so a
    checkpointing holder moves at its park plus restore cost instead of a cold start."""
    best: MovePlan | None = None
    for x in cards:
        short = need - ledger.available(x, waiter)
        if short <= 0:
            return None                                   # it fits: the ladder's first rung
        plan = _plan_on(ledger, waiter, x, short, restore_across, protected)
        if plan is not None and (best is None or plan.cost_s < best.cost_s):
            best = plan
    return best


def _plan_on(ledger: Ledger, waiter: str, x: str, short: int, restore_across: bool,
             protected: frozenset[str]) -> MovePlan | None:
    """The cheapest moves off card ``x`` that free ``short`` bytes there."""
    movers = [le for le, sh in ledger.shares_on(x)
              if le.id != waiter and le.id not in protected and sh.state is S.ACTIVE
              and move_block(le) is None]
    best: MovePlan | None = None
    tried = 0
    for k in range(1, MAX_MOVES + 1):
        for group in itertools.combinations(movers, k):
            tried += 1
            if tried > MAX_SETS:
                return best
            moves = _place_group(ledger, x, group, restore_across)
            if moves is None or sum(m.frees_bytes for m in moves) < short:
                continue
            cost = sum(m.cost_s for m in moves)
            if best is None or cost < best.cost_s:
                best = MovePlan(waiter, x, tuple(moves), cost)
        if best is not None:
            return best                                   # fewer moves win over cheaper pairs
    return best


def _place_group(ledger: Ledger, x: str, group: tuple[Lease, ...],
                 restore_across: bool) -> list[Move] | None:
    """A destination card for each holder of ``group`` (moving off ``x``), best fit first, with
    what earlier holders of the group take counted; ``None`` when one has nowhere to go."""
    taken: dict[str, int] = {}
    out: list[Move] = []
    for le in sorted(group, key=lambda le: -le.shares[x].size_bytes):
        sh = le.shares[x]
        takes = sh.reserved_bytes or sh.size_bytes
        room = {y: ledger.available(y, le.id) - taken.get(y, 0)
                for y in ledger.cards if y != x}
        fits = [y for y, r in room.items() if r >= takes]
        if not fits:
            return None
        dst = min(fits, key=lambda y: room[y] - takes)      # best fit: large holes stay whole
        taken[dst] = taken.get(dst, 0) + takes
        restore = restore_across and le.caps.park is not None and le.caps.park.value == \
            "checkpoint" and le.park_cost_s > 0
        cost = le.park_cost_s + le.switch_cost_s if restore else le.switch_cost_s
        out.append(Move(le.id, le.engine, x, dst, counted_bytes(sh), takes, cost,
                        "restore" if restore else "restart"))
    return out
