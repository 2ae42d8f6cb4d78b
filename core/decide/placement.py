"""Placement: which card each share of a lease goes on.

Source: issue 25 (placement across cards, decided at grant time), issue 23 ("decide inside the
single writer"; STYLE.md after llama-swap issue #946: a read that gates a mutation is a bug),
issue 7 (a request that adopts a running process). Pure: no I/O, no clock.

At the request, :func:`place` checks the asks and gives every share a first card:

1. a share that names its card (PCI address or short name) goes there, for good;
2. a share that names none, of a request that adopts a process already holding memory, goes
   on the card where that process holds the most bytes, for good;
3. a share that names none goes, for now, on the card with the most room (each on its own
   card): it is *movable* (:attr:`~.model.Lease.movable`).

The choice that counts is made at grant time: at every admission pass, inside berthd's single
writer, :func:`choose` places a waiting lease's movable shares anew on the ledger as it is then,
until room starts being made for it (its cards are then fixed). Every card, or set of N cards
for a lease that asks for any N, is a candidate, scored by :class:`Score`: the ladder's cost of
making room there (nothing when it fits; then a lend, a park, a drain, each by its measured
cost; drains of engines that cannot park last), ties broken by best fit (least room left over),
so that large holes stay whole. A parked lease wakes on the card its checkpoint came from
(cuda-checkpoint restores onto the same device), unless its tool restores onto another card
(``--device-map``, driver 580+; issue 35): its wake is then placed as a grant is, and stays
home on a tie; a drained one asks anew and is placed anew.

A lease over several cards is ranked by demand first (issue 35, :func:`_rank`): its turn takes
cards from every engine on them, so a set whose holders are asked for more than the waiter
itself (:func:`.demand.recent`: requests in the last quarter hour) comes after a set where no
room can be made *now* (it waits for the cards of holders in less demand), and sets with room
are ranked by the demand they displace before their measured cost; a holder that serves
requests now counts each as :data:`SERVING_WEIGHT` requests asked for lately
(:func:`displaced`). It lasts while the waiter
has waited less than :data:`DEFER_LIMIT_S`, so no multi-card waiter waits on demand for ever.
Measured on ``bench/policy``'s four-card workload (a 60 GiB engine over three of four cards
beside seven one-card engines; bench/policy/README.md, issue 35): the two busy chat engines
wait less (their p95s summed) on 15 of 20 seeds, the p95 on the committed trace falls from 1.05x swap-matrix's to
0.56x, and rises on seed 9 from 0.87x to 1.15x; with requests in flight weighed
(:data:`SERVING_WEIGHT`) seed 9 is at 0.79x and every seed 1-10 at or under swap-matrix's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from .admission import Policy, Waiter, WaitKind, reservation
from .demand import recent
from .ladder import Action, NoPlan, plan
from .ledger import Ledger
from .model import Lease, Share, ShareState
from .turns import SwapLog
from .units import format_size

__all__ = ["Ask", "PlacementError", "place", "shares_for", "movable_of", "Score", "Choice",
           "choose", "displaced", "MAX_SETS", "DEFER_LIMIT_S", "SERVING_WEIGHT"]

#: The most candidate card sets scored for one waiter (8 cards, any 4: 70 sets).
MAX_SETS = 256
#: How many requests asked for lately one request in flight weighs, in the demand a park or a
#: drain displaces (:func:`displaced`). Measured on ``bench/policy``'s four-card workload
#: (bench/policy/README.md, issue 35, third pass): 1 and 2 change nothing, 5 and 10 bring seed
#: 9 under swap-matrix's p95, 50 puts seed 5 over it.
SERVING_WEIGHT = 10
#: How long a lease over several cards waits for holders in less demand than itself before
#: the ladder's plain ranking comes back (seconds; twice a front's 120 s hold by default).
DEFER_LIMIT_S = 240.0


@dataclass(frozen=True)
class Ask:
    """One share as a request asks for it: ``card`` a PCI address or short name (``None``:
    Berth places it), ``size_bytes`` (``None``: the whole card), ``need_bytes`` what it needs
    now under the ``current``/``growth`` bounds (``None``: its size)."""

    card: str | None
    size_bytes: int | None
    need_bytes: int | None = None


class PlacementError(ValueError):
    """A share that cannot be placed. ``field`` names it as the request does
    (``shares.<i>.card``, ``shares.<i>.size``); the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def place(ledger: Ledger, asks: list[Ask], held: dict[str, int | None]) -> list[str]:
    """The PCI address of the first card for each ask, in order (steps 1-3 of the module's
    rule); :func:`movable_of` says which of them :func:`choose` may move.

    ``held``: bytes the adopted process already holds per card (``{}`` when the request adopts
    none; ``None`` where the driver cannot say). Raises :class:`PlacementError` naming the
    share: an unknown card, a card named twice, a size of 0 bytes or less, a size larger than
    every card's capacity, or more shares naming no card than cards that can hold them."""
    out: list[str | None] = []
    for i, ask in enumerate(asks):
        if ask.size_bytes is not None and ask.size_bytes <= 0:
            raise PlacementError(f"shares.{i}.size", "must be more than 0 bytes")
        if ask.card is None:
            out.append(None)
            continue
        try:                                                                     # (1)
            pci = ledger.card(ask.card).pci
        except KeyError as e:
            raise PlacementError(f"shares.{i}.card", e.args[0]) from None
        if pci in out:
            raise PlacementError(f"shares.{i}.card", f"card {ask.card!r} is named twice")
        out.append(pci)
    for i, ask in enumerate(asks):
        if out[i] is None:
            out[i] = _unnamed(ledger, i, ask, held, {p for p in out if p})
    return [p for p in out if p]


def _unnamed(ledger: Ledger, i: int, ask: Ask, held: dict[str, int | None],
             taken: set[str]) -> str:
    """Steps (2) and (3) for a share that names no card, on a card no other share took."""
    mine = {p: b for p, b in held.items() if b and p not in taken}
    if mine:                                                                     # (2)
        return max(mine, key=mine.get)
    fits = [p for p, c in ledger.cards.items()                                   # (3)
            if ask.size_bytes is None or ask.size_bytes <= c.capacity_bytes]
    if not fits:
        big = max(ledger.cards.values(), key=lambda c: c.capacity_bytes)
        raise PlacementError(f"shares.{i}.size", f"{format_size(ask.size_bytes)} is larger than "
                                                 f"every card's capacity (the largest is "
                                                 f"{big.name}'s {format_size(big.capacity_bytes)}"
                                                 f": its total less its reserve, baseline and "
                                                 f"claims)")
    left = [p for p in fits if p not in taken]
    if not left:
        raise PlacementError(f"shares.{i}.card", f"{i + 1} shares want a card of their own "
                                                 f"and only {len(fits)} "
                                                 f"card{'s' if len(fits) != 1 else ''} can hold "
                                                 f"{format_size(ask.size_bytes)}; ask for "
                                                 f"fewer shares")
    return max(left, key=lambda p: (ledger.available(p), ledger.cards[p].capacity_bytes))


def movable_of(asks: list[Ask], cards: list[str], held: dict[str, int | None]) -> frozenset[str]:
    """The cards (of ``cards``, as :func:`place` gave them) whose shares named no card and
    adopt nothing there: those :func:`choose` places anew while the lease waits."""
    return frozenset(p for ask, p in zip(asks, cards, strict=True)
                     if ask.card is None and not held.get(p))


def shares_for(asks: list[Ask], cards: list[str],
               held: dict[str, int | None]) -> tuple[dict[str, Share], dict[str, int]]:
    """The waiting shares of a new lease (by PCI address) and its need per card (bytes), from
    its asks placed on ``cards`` (:func:`place`); each share's use starts at what the adopted
    process holds there (``held``)."""
    shares: dict[str, Share] = {}
    need: dict[str, int] = {}
    for ask, pci in zip(asks, cards, strict=True):
        shares[pci] = Share(pci, ask.size_bytes or 0, whole_card=ask.size_bytes is None)
        shares[pci].used_bytes = held.get(pci)
        if ask.need_bytes is not None:
            need[pci] = ask.need_bytes
    return shares, need


# -- the choice at grant time -------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Score:
    """How dear a candidate set of cards is; lower is better, compared field by field
    (issue 25). ``tier``: the dearest way of making room there: 0 it fits now, 1 a lend,
    2 a park, 3 a drain of an engine that could park (the host RAM budget refused it), 4 a
    drain of an engine that cannot park, 5 no room now (holders protected, room being made
    there, an earlier waiter first), 6 no room while what stands there stays. ``cost_s``: the
    steps' measured cost in seconds (a park's checkpoint and its restore later, a drain's cold
    start back; 0 where never measured). ``moved_bytes``: what the steps move. ``left_bytes``:
    room left over once the waiter is in (best fit: least first); for tiers 5 and 6 the room
    still missing (least first). ``demand``: how much the holders the steps park or drain
    are asked for (:func:`displaced`, summed: lately, and more for each request they serve
    now; ranked first for a lease over several cards, :func:`_rank`, last for any other)."""

    tier: int
    cost_s: float
    moved_bytes: int
    left_bytes: int
    demand: int = 0


@dataclass(frozen=True)
class Choice:
    """Where :func:`choose` puts a waiter's movable shares: ``moves`` maps each share's card now
    to its card from now on (PCI addresses; unchanged ones included), ``score`` the chosen
    set's, ``runner_up`` the next best set's (``None``: no other set), ``why`` in words."""

    moves: dict[str, str]
    score: Score
    runner_up: Score | None
    why: str


_TIER = {Action.LEND: 1, Action.PARK: 2, Action.DRAIN: 3}


def choose(ledger: Ledger, w: Waiter, policy: Policy, now: float, swaps: SwapLog | None,
           busy: frozenset[str], room_of: Callable[[str], int],
           blocked: set[str]) -> Choice | None:
    """The best set of cards for waiter ``w``'s movable shares now, or ``None`` when it has none
    (or no set can ever hold them). ``room_of(pci)``: bytes the waiter may be granted on the
    card in this admission pass (what earlier waiters of the pass took left out). ``blocked``:
    cards an earlier waiter holds in this pass (the waiter could not be granted there now).
    ``busy``: cards where room is being made for another waiter (the ladder plans nothing
    there). Each set is scored (:class:`Score`) by the ladder's own plan (:func:`.ladder.plan`)
    for the waiter on it."""
    lease = ledger.leases[w.lease_id]
    movable = [p for p in lease.shares if p in lease.movable]
    if not movable:
        return None
    fixed = {p: _need(ledger, lease, p, p) for p in lease.shares if p not in lease.movable}
    scored: list[tuple[Score, dict[str, str]]] = []
    for cards in _sets(ledger, lease, movable, set(fixed)):
        need = dict(fixed)
        for p, c in zip(movable, cards, strict=True):
            need[c] = _need(ledger, lease, p, c)
        if any(b > ledger.cards[c].capacity_bytes for c, b in need.items()):
            continue
        s = _score(ledger, w, need, policy, now, swaps, busy, room_of, blocked)
        scored.append((s, dict(zip(movable, cards, strict=True))))
    if not scored:
        return None
    own = recent(lease, now) + 1 if len(lease.shares) > 1 and \
        now - w.since < DEFER_LIMIT_S else None
    if w.kind is WaitKind.RESUME:
        # A wake stays where it parked unless another card is strictly better (issue 35).
        scored.sort(key=lambda x: (_rank(x[0], own), x[0],
                                   any(a != b for a, b in x[1].items())))
    else:
        scored.sort(key=lambda x: (_rank(x[0], own), x[0]))
    best, moves = scored[0]
    runner = scored[1][0] if len(scored) > 1 else None
    return Choice(moves, best, runner, _why(ledger, moves, best, runner))


def _rank(s: Score, own: int | None) -> tuple[int, int]:
    """What orders a candidate set before its :class:`Score` (issue 35). ``own``: ``None`` for
    the plain ranking (by tier alone); else the waiter's own demand (its recent requests and
    the one it waits with), and then: it fits now; room is made displacing no more demand than
    its own, the least first; no room now; room is made displacing more, the least first; no
    room while what stands there stays."""
    if own is None or s.tier == 0:
        return (s.tier, 0)
    if s.tier <= 4:
        return (1, s.demand) if s.demand <= own else (3, s.demand)
    return (2 if s.tier == 5 else 4, 0)


def _need(ledger: Ledger, lease: Lease, key: str, card: str) -> int:
    """Bytes the share now keyed ``key`` would reserve on ``card`` (:func:`.admission.reservation`;
    a whole-card share takes the card's capacity)."""
    sh = lease.shares[key]
    if sh.state is ShareState.PARKED:
        # A wake brings back what its park took (:func:`.admission.waiter_need`).
        return max(0, max(sh.reserved_bytes, sh.parked_bytes) - sh.residual_bytes)
    return ledger.capacity(card) if sh.whole_card else reservation(lease, key, sh.size_bytes)


def _sets(ledger: Ledger, lease: Lease, movable: list[str], fixed: set[str]):
    """Candidate cards for the movable shares, in their order: any N of the cards the fixed
    shares leave (sets when the shares are alike, orders when they differ), at most
    :data:`MAX_SETS`."""
    free = [p for p in ledger.cards if p not in fixed]
    alike = len({(lease.shares[p].size_bytes, lease.shares[p].whole_card,
                  lease.need_bytes.get(p)) for p in movable}) <= 1
    sets = itertools.combinations(free, len(movable)) if alike else \
        itertools.permutations(free, len(movable))
    return itertools.islice(sets, MAX_SETS)


def _score(ledger: Ledger, w: Waiter, need: dict[str, int], policy: Policy, now: float,
           swaps: SwapLog | None, busy: frozenset[str], room_of: Callable[[str], int],
           blocked: set[str]) -> Score:
    """One candidate set's :class:`Score`."""
    left = sum(room_of(p) - b for p, b in need.items())
    if not (set(need) & blocked) and all(room_of(p) >= b for p, b in need.items()):
        return Score(0, 0.0, 0, left)
    p = plan(ledger, Waiter(w.lease_id, w.kind, w.priority, w.since, need), policy, now, swaps,
             busy)
    if isinstance(p, NoPlan) or not p.steps:
        # No plan, or it fits by the ledger but an earlier waiter of this pass comes first.
        lasting = isinstance(p, NoPlan) and p.lasting
        return Score(6 if lasting else 5, 0.0, 0, -left)
    tier, cost, moved, demand = 0, 0.0, 0, 0
    for step in p.steps:
        victim = ledger.leases[step.lease_id]
        demand += displaced(victim, now)
        cannot_park = step.action is Action.DRAIN and not victim.caps.can_park()
        tier = max(tier, _TIER[step.action] + cannot_park)
        cost += _cost_s(victim, step.action)
        moved += sum(step.frees_bytes.values())
    return Score(tier, cost, moved, left, demand)


def displaced(victim: Lease, now: float) -> int:
    """The demand a park or a drain of ``victim`` displaces (issue 35): what it was asked for
    lately (:func:`.demand.recent`), and :data:`SERVING_WEIGHT` more for each request it serves
    now. A holder caught mid-session is dearer than one asked for as often that is idle: its
    park or drain waits for those requests (the waiter with it), and its client's next one
    follows within the session, so it asks back at once and takes the one card the lease
    leaves from whoever stands there."""
    return recent(victim, now) + SERVING_WEIGHT * victim.in_flight


def _cost_s(victim: Lease, action: Action) -> float:
    """What a step costs, measured (seconds): a park's checkpoint and the restore it brings
    later; a drain's cold start back; a lend nothing that is measured."""
    if action is Action.PARK:
        return victim.park_cost_s + victim.switch_cost_s
    if action is Action.DRAIN:
        return victim.switch_cost_s
    return 0.0


_TIER_WORDS = ("it fits there", "a lend makes room there", "a park makes room there",
               "only a drain makes room there", "only a drain of an engine that cannot park "
               "makes room there", "no room can be made now", "no room can be made")


def _why(ledger: Ledger, moves: dict[str, str], best: Score, runner: Score | None) -> str:
    """The choice in words, for the grant's note."""
    names = ", ".join(ledger.cards[c].name for c in moves.values())
    words = f"placed on {names}: {_TIER_WORDS[best.tier]}"
    if best.tier == 0 and runner is not None and runner.tier == 0:
        words += (f" with {format_size(max(0, best.left_bytes))} left over, the best fit "
                  f"(next best leaves {format_size(max(0, runner.left_bytes))})")
    elif runner is not None and runner.tier > best.tier:
        words += f" (elsewhere {_TIER_WORDS[runner.tier]})"
    return words
