"""Admission control: bounds, verdicts and the head-of-line policy.

Source: seed 000 (all of it) and seed 002 rule 7 ("each card keeps its floor").

- **Bounds** (seed 000 "Admission bounds and their honesty"): :func:`reservation` gives the bytes a
  share reserves at its grant under ``declared``, ``current`` or ``growth``.
- **Verdicts**: :func:`verdict` says :attr:`Fit.FITS`, :attr:`Fit.NO_ROOM_NOW` or
  :attr:`Fit.NEVER` ("can never fit on this card", like Kubernetes' "unschedulable whatever we
  evict"). The reserve is subtracted from free bytes (:meth:`Ledger.available`), never compared.
- **Queue policy** (seed 000 "Head-of-line blocking"): ``strict`` keeps arrival order and holds
  the head's need free while it accumulates; ``scan`` admits later waiters that fit, and turns a
  head strict after ``scan_max_skips`` skips or ``scan_max_wait_s`` seconds so it is never
  starved. Head-of-line is per card: a waiter is only ever held back by earlier waiters that
  share a card with it, so the cards of a mixed box schedule apart (seed 002 stage B).

Queue order is: extensions of running holders first (the watermark exists for "growth of
admitted work"), then priority (higher first), then arrival.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from dataclasses import dataclass, field
from typing import Callable

# QueuePolicy's home is .kinds, which the config schema reads without this module.
from .kinds import QueuePolicy
from .ledger import Ledger
from .model import Bound, Lease, ShareState
from .units import format_size

__all__ = ["QueuePolicy", "Policy", "Fit", "WaitKind", "Waiter", "Queue", "reservation",
           "verdict", "waiter_need", "grant", "admission_pass", "PassResult"]

S = ShareState


@dataclass(frozen=True)
class Policy:
    """The broker's knobs, in seconds and bytes (berth.toml ``[policy]``).

    - ``queue``: ``strict`` or ``scan`` (seed 000 "Head-of-line blocking").
    - ``scan_max_skips`` / ``scan_max_wait_s``: after this many later admissions past it, or this
      long waiting, a head turns strict.
    - ``release_grace_s``: a park or lend not confirmed by then falls back to drain (rule 4).
    - ``wake_limit_s``: a wake (or a return) not answered by then stops the engine (rule 4).
    - ``wait_limit_s``: the longest a front holds a request.
    - ``min_turn_s``: a holder is not displaced before it has held its card this long.
    - ``juggle_window_s`` / ``juggle_max_swaps``: two engines may take a card from each other at
      most this many times inside the window; the next swap back waits.
    - ``hook_residual_guess_bytes``: the residual the ladder expects from a hook park it has never
      measured for that engine (checkpoint parks leave nothing).
    - ``read_interval_s``: how often the daemon reads the driver (for the suggested reserve).
    - ``max_job_s``: how long the ladder waits for a holder's requests in flight before it
      displaces it anyway (an engine entry's ``max_job`` overrides it; issue 12 case 4).
    - ``max_turn_s``: while a waiter of equal priority waits, the longest a holder keeps its card
      for demand that comes during its turn (its backlog, and an idle spell shorter than a
      switch back would cost: rent or buy, issue 24); counted from when it could serve.
    - ``first_request_s``: how long a holder that has just become ready (or woke) keeps its card
      for its first request: a manager's health poll (llama-swap's 1 s) plus a margin.
    - ``rent_fixed_s``: when >= 0, an idle holder's rent (how long it keeps its card against an
      equal-priority waiter) is this many seconds instead of what a switch back would cost; for
      the policy simulator's hindsight row (the best fixed rent per workload), not a user knob.
    - ``demand_trust``: λ in [0, 1], how far an idle holder's turn trusts the forecast of its
      demand (:mod:`berth.decide.demand`, issue 34): forecast to see none, it yields after
      λ × the rent; forecast to see some, it keeps its card up to the rent / λ (its
      ``max_turn`` caps it); 1 is the plain rent. Each holder's wrong forecasts raise its own λ
      towards 1. Since issue 34's yardstick a waiter whose request is older than any the holder
      expects ends that keep at once (inside the holder's minimum turn, demand still keeps it
      up to the rent), so λ acts only where the waiter's request time is not known.
    """

    queue: QueuePolicy = QueuePolicy.SCAN
    scan_max_skips: int = 8
    scan_max_wait_s: float = 30.0
    release_grace_s: float = 20.0
    wake_limit_s: float = 60.0
    wait_limit_s: float = 120.0
    min_turn_s: float = 10.0
    juggle_window_s: float = 120.0
    juggle_max_swaps: int = 4
    hook_residual_guess_bytes: int = 2 << 30
    read_interval_s: float = 1.0
    max_job_s: float = 3600.0
    max_turn_s: float = 60.0
    first_request_s: float = 1.5
    rent_fixed_s: float = -1.0
    demand_trust: float = 0.0


class Fit(enum.StrEnum):
    FITS = "fits"
    NO_ROOM_NOW = "no_room_now"
    NEVER = "never"


class WaitKind(enum.StrEnum):
    GRANT = "grant"     # a new lease's shares: waiting -> active
    RESUME = "resume"   # a parked lease wants its memory back: parked -> resuming
    EXTEND = "extend"   # a growth-bound holder passed its reservation
    RETURN = "return"   # a lender whose borrower is gone grows back: lent -> returning


#: ``place(waiter, room_of, blocked)``: see :func:`admission_pass`.
Placer = Callable[["Waiter", Callable[[str], int], set[str]], None]

_KIND_RANK = {WaitKind.EXTEND: 0, WaitKind.RETURN: 0, WaitKind.RESUME: 1, WaitKind.GRANT: 1}
_seq = itertools.count()


@dataclass
class Waiter:
    """One entry of the waiting queue. ``need`` maps PCI address to the bytes the entry would
    add to the card's count (see :func:`waiter_need`; ``whole_card`` shares are resolved then)."""

    lease_id: str
    kind: WaitKind
    priority: int
    since: float
    need: dict[str, int]
    seq: int = field(default_factory=lambda: next(_seq))
    skips: int = 0
    counted_rejected: bool = False

    @property
    def key(self) -> tuple:
        return (_KIND_RANK[self.kind], -self.priority, self.since, self.seq)


class Queue:
    """The waiting queue, kept in order (:attr:`Waiter.key`). One entry per lease at most."""

    def __init__(self) -> None:
        self._items: list[Waiter] = []
        self._by_lease: dict[str, Waiter] = {}

    def push(self, w: Waiter) -> None:
        if w.lease_id in self._by_lease:
            raise ValueError(f"lease {w.lease_id}: already waiting")
        keys = [x.key for x in self._items]
        self._items.insert(bisect.bisect_right(keys, w.key), w)
        self._by_lease[w.lease_id] = w

    def remove(self, lease_id: str) -> Waiter | None:
        w = self._by_lease.pop(lease_id, None)
        if w is not None:
            self._items.remove(w)
        return w

    def get(self, lease_id: str) -> Waiter | None:
        return self._by_lease.get(lease_id)

    def __iter__(self):
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, lease_id: str) -> bool:
        return lease_id in self._by_lease


def reservation(lease: Lease, pci: str, size_bytes: int) -> int:
    """Bytes a share reserves at its grant under its lease's bound (seed 000).

    ``declared``: the declared maximum ``size_bytes``. ``current``: the measured need only
    (``lease.need_bytes[pci]``, else the size). ``growth``: need + the growth allowance, at most
    the size.
    """
    need = lease.need_bytes.get(pci, size_bytes)
    if lease.bound is Bound.DECLARED:
        return size_bytes
    if lease.bound is Bound.CURRENT:
        return min(need, size_bytes)
    return min(size_bytes, need + lease.growth_allowance_bytes)


def waiter_need(ledger: Ledger, w: Waiter) -> dict[str, int]:
    """Recompute ``w.need`` from the ledger: what granting ``w`` adds to each card's count."""
    lease = ledger.leases[w.lease_id]
    if w.kind is WaitKind.GRANT:
        need = {}
        for pci, sh in lease.shares.items():
            if sh.whole_card:
                need[pci] = ledger.capacity(pci)
            else:
                need[pci] = reservation(lease, pci, sh.size_bytes)
        w.need = need
    elif w.kind is WaitKind.RESUME:
        # A wake brings back what the park took away, which under the current and growth
        # bounds can be more than the reservation.
        w.need = {pci: max(0, max(sh.reserved_bytes, sh.parked_bytes) - sh.residual_bytes)
                  for pci, sh in lease.shares.items() if sh.state is S.PARKED}
    elif w.kind is WaitKind.RETURN:
        w.need = {pci: sh.lent_bytes for pci, sh in lease.shares.items()
                  if sh.state is S.LENT and sh.lent_to is None}
    return w.need


def verdict(ledger: Ledger, pci: str, need_bytes: int, for_lease: str | None = None,
            outranked_bytes: int = 0) -> Fit:
    """Whether ``need_bytes`` more may be counted on ``pci`` for ``for_lease`` now.

    ``NEVER`` when the need exceeds the card's capacity (total − reserve − baseline − claims),
    ``FITS`` when it is within :meth:`Ledger.available` (``outranked_bytes``: earmarks that do
    not hold against it), else ``NO_ROOM_NOW``.
    """
    if need_bytes > ledger.cards[pci].capacity_bytes:
        return Fit.NEVER
    if need_bytes <= ledger.available(pci, for_lease, outranked_bytes):
        return Fit.FITS
    return Fit.NO_ROOM_NOW


def grant(ledger: Ledger, w: Waiter, now: float) -> None:
    """Apply a grant to the ledger: shares move waiting -> active (reserving ``w.need``),
    parked -> resuming, lent -> returning, or an extension raises the reservation. Clears the
    waiter's earmark.
    """
    lease = ledger.leases[w.lease_id]
    for pci, need in w.need.items():
        if w.kind is WaitKind.GRANT:
            sh = lease.shares[pci]
            size = need if sh.whole_card else sh.size_bytes
            ledger.move(w.lease_id, pci, S.ACTIVE, now, reserved_bytes=need, size_bytes=size)
        elif w.kind is WaitKind.RESUME:
            sh = lease.shares[pci]
            ledger.move(w.lease_id, pci, S.RESUMING, now,
                        reserved_bytes=max(sh.reserved_bytes, sh.parked_bytes))
        elif w.kind is WaitKind.RETURN:
            # lent_bytes stays N while returning(N): a restart must know what to ask back.
            ledger.move(w.lease_id, pci, S.RETURNING, now, lent_to=None)
        else:
            sh = lease.shares[pci]
            ledger.update(w.lease_id, pci, reserved_bytes=sh.reserved_bytes + need)
    if w.kind is WaitKind.GRANT:
        lease.granted_at = now
    lease.last_used_at = now
    ledger.earmark(w.lease_id, {})


@dataclass
class PassResult:
    """What one admission pass decided. ``granted`` were applied to the ledger already;
    ``never`` are waiters that can never fit (with a reason); ``rejected_with_free`` counts the
    waiters refused for the first time while free bytes above the watermark stood on all their
    cards (seed 000 "Measuring whether the policy works"). ``stale``: cards on which a waiter
    fits by a read older than this pass (a read must be taken first, rule 1). ``behind`` maps a
    waiter held back by an earlier one on its cards to that earlier waiter's lease id."""

    granted: list[Waiter] = field(default_factory=list)
    never: list[tuple[Waiter, str]] = field(default_factory=list)
    rejected_with_free: int = 0
    stale: set[str] = field(default_factory=set)
    behind: dict[str, str] = field(default_factory=dict)


def admission_pass(ledger: Ledger, queue: Queue, policy: Policy, now: float,
                   make_room: Callable[[Waiter], bool] | None = None,
                   room_in_flight: Callable[[Waiter], bool] | None = None,
                   fresh: Callable[[str], bool] | None = None,
                   place: Placer | None = None) -> PassResult:
    """One pass over the queue in order (priority, then age); grants what the policy admits.

    Room goes to the best waiter at the moment it appears, not to the one it was made for
    (issue 24): the earmark of a waiter for whom room is being made holds against the waiters
    it ranks before, never against one that ranks before it. A later arrival of equal
    priority ranks after it and cannot strand that room. Steps, numbered as in the code:

    1. a waiter that can never fit on one of its cards is taken out (``never``);
    2. a waiter that fits and is not held back by an earlier waiter on its cards is granted,
       if every one of its cards was read in this step (``fresh``); otherwise its cards go in
       ``stale`` and are held, so the caller reads them and passes again (rule 1: a grant is
       decided on a driver read taken after the request, never on the last periodic one);
    3. a waiter that does not fit yet but whose room is being made (``room_in_flight``) holds its
       cards: nothing behind it on those cards is admitted, whatever the policy;
    4. a waiter that does not fit (or is held back) is refused for now; ``make_room`` may start
       making room for it (the ladder), and a waiter with room being made holds its cards;
    5. under ``strict`` a refused waiter holds its cards; under ``scan`` only once it has been
       skipped ``scan_max_skips`` times or waited ``scan_max_wait_s``. A waiter that would not
       fit even on its emptied cards (stowaways in the way, or holders Berth can never free:
       issue 24) holds nothing.

    Before step 1, ``place`` may put a new lease's movable shares on other cards (issue 25:
    placement at grant time, :func:`.placement.choose`; and a wake's, where the checkpoint
    restores onto another card, issue 35): it is given the bytes the waiter may
    be granted per card in this pass (what earlier waiters granted or about to be granted on a
    read being taken left out) and the cards earlier waiters hold for other reasons.

    Decisions are made here, inside the single writer, never from a snapshot taken outside it.
    """
    order = list(queue)
    p = _Pass(ledger, queue, policy, now, make_room, room_in_flight, fresh, place)
    for w in order:
        for pci, b in ledger.earmarks.get(w.lease_id, {}).items():
            p.later[pci] = p.later.get(pci, 0) + b
    for w in order:
        for pci, b in ledger.earmarks.get(w.lease_id, {}).items():
            p.later[pci] -= b
        p.consider(w)
    return p.res


@dataclass
class _Pass:
    """One admission pass in progress: the cards held for earlier waiters (``held``, and by
    whom: ``held_by``), and the earlier refused waiters a later grant skips past."""

    ledger: Ledger
    queue: Queue
    policy: Policy
    now: float
    make_room: Callable[[Waiter], bool] | None
    room_in_flight: Callable[[Waiter], bool] | None
    fresh: Callable[[str], bool] | None
    place: Placer | None = None
    res: PassResult = field(default_factory=PassResult)
    held: set[str] = field(default_factory=set)
    #: cards held for another reason than a read being taken (those waiters go at once)
    hard: set[str] = field(default_factory=set)
    #: bytes per card of waiters that fit and wait only for that read
    promised: dict[str, int] = field(default_factory=dict)
    held_by: dict[str, str] = field(default_factory=dict)
    skippable: list[Waiter] = field(default_factory=list)
    #: earmarks (bytes per card) of the waiters not considered yet: they rank after the one
    #: considered now, and do not hold against it
    later: dict[str, int] = field(default_factory=dict)

    def consider(self, w: Waiter) -> None:
        """Steps (1)-(5) of :func:`admission_pass` for one waiter."""
        led = self.ledger
        if self.place is not None and w.kind in (WaitKind.GRANT, WaitKind.RESUME):
            self.place(w, lambda p: (led.available(p, w.lease_id, self.later.get(p, 0))
                                     - self.promised.get(p, 0)), self.hard)
        need = waiter_need(led, w)
        cards = set(need)
        verdicts = {pci: verdict(led, pci, b, w.lease_id, self.later.get(pci, 0))
                    for pci, b in need.items()}
        never = [pci for pci, v in verdicts.items() if v is Fit.NEVER]
        if never:                                                                # (1)
            c = led.cards[never[0]]
            n = need[never[0]]
            self.res.never.append((w, f"needs {format_size(n)} on {c.name} ({c.pci}), more "
                                      f"than its capacity of {format_size(c.capacity_bytes)} "
                                      f"(total − reserve − baseline − claims)"))
            self.queue.remove(w.lease_id)
            return
        fits = all(v is Fit.FITS for v in verdicts.values())
        if fits and not (cards & self.held):                                     # (2)
            if self.fresh is not None and not all(self.fresh(p) for p in cards):
                self.res.stale |= cards
                self._hold(cards, w, stale=True)
                for p, b in need.items():
                    self.promised[p] = self.promised.get(p, 0) + b
            else:
                self._grant(w, cards)
            return
        if cards & self.held:
            self.res.behind[w.lease_id] = self.held_by[sorted(cards & self.held)[0]]
        if self.room_in_flight is not None and self.room_in_flight(w):          # (3)
            self._hold(cards, w)
            return
        self._refuse(w, need, fits)

    def _grant(self, w: Waiter, cards: set[str]) -> None:
        self.queue.remove(w.lease_id)
        grant(self.ledger, w, self.now)
        self.res.granted.append(w)
        for earlier in list(self.skippable):
            if set(earlier.need) & cards:
                earlier.skips += 1
                if earlier.skips >= self.policy.scan_max_skips:   # it turns strict now
                    self._hold(set(earlier.need), earlier)
                    self.skippable.remove(earlier)

    def _refuse(self, w: Waiter, need: dict[str, int], fits: bool) -> None:
        """Steps (4) and (5)."""
        led, pol, cards = self.ledger, self.policy, set(need)
        started = False
        if not fits and not (cards & self.held) and self.make_room is not None:
            started = self.make_room(w)
        # (4) Counted only once nothing is done for it: a waiter for whom room is being made
        # (a park, lend or drain begun) is served, not refused (issue 37: every switch on the
        # simulated cards counted as "refused while memory was free").
        if not started and not w.counted_rejected and \
                all(led.available(p, w.lease_id) > 0 for p in cards):
            w.counted_rejected = True
            self.res.rejected_with_free += 1
        # (5) A waiter that would not fit even on its emptied cards (stowaways stand in the
        # way) holds nothing: holding memory idle for it would only starve the others.
        hopeless = any(b > led.capacity(p) - led.unfreeable(p) for p, b in need.items())
        if started or (not hopeless and (pol.queue is QueuePolicy.STRICT or (
                w.skips >= pol.scan_max_skips or self.now - w.since >= pol.scan_max_wait_s))):
            self._hold(cards, w)
        elif not hopeless:
            self.skippable.append(w)

    def _hold(self, cards: set[str], w: Waiter, stale: bool = False) -> None:
        for pci in cards - self.held:
            self.held_by[pci] = w.lease_id
        self.held |= cards
        if not stale:
            self.hard |= cards
