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

:func:`plan_moves` is the bounded search: for a waiter that needs ``need`` bytes on each of N
cards, it tries every set of N cards the waiter could go on, and moves off each card X of the set
the fewest, cheapest holders that fit now on a card Y outside the set (each by its measured cost: a restore onto Y where the tool restores across
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
    """Moves that let the waiter fit on ``cards`` (PCI addresses, one per share) with nothing
    parked or drained; ``cost_s`` is their sum (seconds)."""

    waiter: str
    cards: tuple[str, ...]
    moves: tuple[Move, ...]
    cost_s: float

    @property
    def card(self) -> str:
        """The first of :attr:`cards` (a one-card waiter's card)."""
        return self.cards[0]

    def why(self, ledger: Ledger) -> str:
        """The plan in words, for the timeline and the board."""
        name = "+".join(ledger.cards[c].name for c in self.cards)
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
               restore_across: bool = False, protected: frozenset[str] = frozenset(),
               count: int = 1) -> MovePlan | None:
    """The cheapest :class:`MovePlan` that lets ``waiter`` (lease id) reserve ``need`` bytes on
    each of ``count`` cards among ``cards`` (PCI addresses it may go on), or ``None`` (no move
    helps, or it fits with none). ``protected``: lease ids the ladder keeps where they are
    (a hold, a higher priority). A moved holder never goes to a card of the waiter's set.
    ``now`` is the broker's clock (seconds; the search itself takes no time into account).
    ``restore_across``: the checkpoint tool restores onto another card (driver 580+), so a
    checkpointing holder moves at its park plus restore cost instead of a restart; a holder
    whose run said so (:attr:`~.model.Capabilities.restore_across`) always does."""
    best: MovePlan | None = None
    for n, group in enumerate(itertools.combinations(cards, count)):
        if n >= MAX_SETS:
            break
        shorts = {x: need - ledger.available(x, waiter) for x in group}
        if all(v <= 0 for v in shorts.values()):
            return None                                   # it fits: the ladder's first rung
        taken: dict[str, int] = {}
        moves: list[Move] = []
        for x in sorted(group, key=lambda x: -shorts[x]):
            if shorts[x] <= 0:
                continue
            got = _plan_on(ledger, waiter, x, shorts[x], restore_across, protected,
                           set(group), taken)
            if got is None:
                break
            moves += got
        else:
            cost = sum(m.cost_s for m in moves)
            if best is None or cost < best.cost_s:
                best = MovePlan(waiter, tuple(group), tuple(moves), cost)
    return best


def _plan_on(ledger: Ledger, waiter: str, x: str, short: int, restore_across: bool,
             protected: frozenset[str], avoid: set[str], taken: dict[str, int]
             ) -> list[Move] | None:
    """The fewest, then cheapest, moves off card ``x`` that free ``short`` bytes there, to
    cards not in ``avoid``; what they take is added to ``taken`` (bytes per card)."""
    movers = [le for le, sh in ledger.shares_on(x)
              if le.id != waiter and le.id not in protected and sh.state is S.ACTIVE
              and move_block(le) is None]
    tried = 0
    for k in range(1, MAX_MOVES + 1):
        best: list[Move] | None = None
        for group in itertools.combinations(movers, k):
            tried += 1
            if tried > MAX_SETS:
                break
            moves = _place_group(ledger, x, group, restore_across, avoid, taken)
            if moves is None or sum(m.frees_bytes for m in moves) < short:
                continue
            if best is None or sum(m.cost_s for m in moves) < sum(m.cost_s for m in best):
                best = moves
        if best is not None:                              # fewer moves win over cheaper pairs
            for m in best:
                taken[m.dst] = taken.get(m.dst, 0) + m.takes_bytes
            return best
    return None


def _place_group(ledger: Ledger, x: str, group: tuple[Lease, ...], restore_across: bool,
                 avoid: set[str], taken: dict[str, int]) -> list[Move] | None:
    """A destination card (not in ``avoid``) for each holder of ``group`` (moving off ``x``),
    best fit first, with what earlier holders took (``taken``, left unchanged) counted;
    ``None`` when one has nowhere to go."""
    mine: dict[str, int] = {}
    out: list[Move] = []
    for le in sorted(group, key=lambda le: -le.shares[x].size_bytes):
        sh = le.shares[x]
        takes = sh.reserved_bytes or sh.size_bytes
        room = {y: ledger.available(y, le.id) - taken.get(y, 0) - mine.get(y, 0)
                for y in ledger.cards if y != x and y not in avoid}
        fits = [y for y, r in room.items() if r >= takes]
        if not fits:
            return None
        dst = min(fits, key=lambda y: room[y] - takes)      # best fit: large holes stay whole
        mine[dst] = mine.get(dst, 0) + takes
        restore = le.caps.park is not None and le.caps.park.value == "checkpoint" and (
            le.caps.restore_across or (restore_across and le.park_cost_s > 0))
        cost = le.park_cost_s + le.switch_cost_s if restore else le.switch_cost_s
        out.append(Move(le.id, le.engine, x, dst, counted_bytes(sh), takes, cost,
                        "restore" if restore else "restart"))
    return out
