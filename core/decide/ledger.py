"""Budgets and counting rules: how many bytes each share counts on its card.

Source: seed 002 "The data model" (counting rules), rules 1, 2 and 7; seed 000 "The watermark".

A card's **budget** is ``total − reserve − baseline − stowaways − claims − Σ counted(share)``.
What a share may be granted is its card's **available** bytes: the budget, but never more than
what the last driver read says is free minus the reserve (the seed's "admits a lease against what
the driver says is free, minus each card's reserve"), minus bytes earmarked for other waiters
whose room is being made. The reserve is subtracted, never merely compared (seed 000).

Counting rule per state (``reserved`` is what admission reserved; ``used`` the driver's last read of
the holder's own use, 0 when unknown; ``N`` the lent bytes):

=============  ===========================  ====================================================
state          counts                        why
=============  ===========================  ====================================================
waiting        0                             nothing granted yet
active         max(reserved, used)           its reservation, or its real use if it overran it
draining       max(reserved − N', used)      it may still use everything until it is gone
released       max(reserved − N', used)      rule 1: free only once a driver read shows it free
freed          0                             a driver read confirmed it free
parking        max(reserved, used)           not free until the driver shows it left
parked         residual                      "parked counts the residual the driver measures"
resuming       max(reserved, used)           rule 2: room was confirmed before the wake began
lending(N)     max(reserved, used)           N has not left the holder yet; no borrower yet
lent(N)        max(reserved − N, used)       "lent(N) counts the share's size minus N"
returning      max(reserved, used)           entered only after the borrower's N is confirmed gone
=============  ===========================  ====================================================

``N'`` is the N still out on loan: a lent share that drains or dies keeps counting ``reserved − N``
because its borrower still holds (and counts) N. A parked share that drains or dies holds only
its residual on the card, so the scheduler sets its reservation to the residual on that edge. The borrower's share counts N as its reservation.
So a lend conserves bytes: lender + borrower count the lender's reservation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Card, Lease, ParkMechanism, Share, ShareState, move, names_card

__all__ = ["Ledger", "counted_bytes", "CardView", "RESIDUAL_SLACK_BYTES", "hook_residual_guess",
           "max_residual"]

S = ShareState
_FULL_STATES = frozenset({S.ACTIVE, S.PARKING, S.RESUMING, S.LENDING, S.RETURNING})
_MINUS_LENT_STATES = frozenset({S.LENT, S.DRAINING, S.RELEASED})


def counted_bytes(share: Share) -> int:
    """Bytes ``share`` counts on its card under the counting rules above."""
    st = share.state
    used = share.used_bytes or 0
    if st in _FULL_STATES:
        return max(share.reserved_bytes, used)
    if st in _MINUS_LENT_STATES:
        return max(share.reserved_bytes - share.lent_bytes, used)
    if st is S.PARKED:
        return share.residual_bytes
    return 0  # waiting, freed


# What a park may leave on the card beyond its expected residual and still count as parked, and
# what a parked (or resuming) share may load before it counts as loaded again: driver reads and
# allocator caches jitter by a few tens of MiB.
RESIDUAL_SLACK_BYTES = 64 << 20


def hook_residual_guess(share: Share, guess_bytes: int) -> int:
    """Bytes a hook park is expected to leave on the card when none was measured yet:
    ``guess_bytes`` (``Policy.hook_residual_guess_bytes``) capped at half what the share counts."""
    return min(guess_bytes, counted_bytes(share) // 2)


def max_residual(lease: Lease, pci: str, guess_bytes: int) -> int:
    """The most (bytes) a park of ``lease`` may leave on ``pci`` and still count as parked: the
    slack for a checkpoint (it frees everything); for a hook, its expected residual
    (:func:`hook_residual_guess`) but never less than the slack. Seed 002 rule 1 (a park is
    what the driver confirms)."""
    if lease.caps.park is ParkMechanism.CHECKPOINT:
        return RESIDUAL_SLACK_BYTES
    return max(RESIDUAL_SLACK_BYTES, hook_residual_guess(lease.shares[pci], guess_bytes))


@dataclass(frozen=True)
class CardView:
    """One card's figures in bytes, as the board shows them (DESIGN.md status keys)."""

    pci: str
    name: str
    total_bytes: int
    reserve_bytes: int
    baseline_bytes: int
    stowaway_bytes: int
    claim_bytes: int
    counted_bytes: int
    budget_bytes: int
    free_bytes: int | None
    available_bytes: int
    earmarked_bytes: int


@dataclass
class Ledger:
    """Cards and leases, with each card's counted bytes cached and kept exact.

    Every change that can alter what a share counts goes through :meth:`move` or :meth:`update`,
    which take the share's old count off its card and put the new one on. :meth:`check` recomputes
    everything from scratch and raises ``AssertionError`` on a mismatch (used by tests).

    ``earmarks`` maps a waiter's lease id to ``{pci: bytes}`` held free for it while its room is
    being made. ``ram_budget_bytes`` is the host RAM parks may use (``None``: no limit known).
    """

    cards: dict[str, Card] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    earmarks: dict[str, dict[str, int]] = field(default_factory=dict)
    ram_budget_bytes: int | None = None
    _counted: dict[str, int] = field(default_factory=dict)
    _earmarked: dict[str, int] = field(default_factory=dict)
    _on_card: dict[str, dict[str, Lease]] = field(default_factory=dict)
    _parked: dict[str, int] = field(default_factory=dict)
    _active: dict[str, dict[str, Lease]] = field(default_factory=dict)
    _undrainable: dict[str, int] = field(default_factory=dict)

    # -- cards ----------------------------------------------------------------------------
    def add_card(self, card: Card) -> None:
        if card.pci in self.cards:
            raise ValueError(f"card {card.pci}: already known")
        self.cards[card.pci] = card
        self._counted.setdefault(card.pci, 0)
        self._earmarked.setdefault(card.pci, 0)
        self._on_card.setdefault(card.pci, {})
        self._parked.setdefault(card.pci, 0)
        self._active.setdefault(card.pci, {})

    def card(self, key: str) -> Card:
        """A card by PCI address or short name. Raises ``KeyError`` naming the key."""
        if key in self.cards:
            return self.cards[key]
        for c in self.cards.values():
            if names_card(key, c.pci, c.name):
                return c
        raise KeyError(f"card {key!r}: no such card (known: "
                       f"{', '.join(f'{c.name}={c.pci}' for c in self.cards.values())})")

    # -- leases ---------------------------------------------------------------------------
    def add_lease(self, lease: Lease) -> None:
        if lease.id in self.leases:
            raise ValueError(f"lease {lease.id}: already known")
        for pci in lease.shares:
            if pci not in self.cards:
                raise KeyError(f"lease {lease.id}: card {pci!r} is not known")
        self.leases[lease.id] = lease
        for pci, share in lease.shares.items():
            self._counted[pci] += counted_bytes(share)
            self._on_card[pci][lease.id] = lease
            self._parked[pci] += share.state is S.PARKED
            self._undrainable[pci] = self._undrainable.get(pci, 0) + (not lease.caps.drain)
            if share.state is S.ACTIVE:
                self._active[pci][lease.id] = lease

    def drop_lease(self, lease_id: str) -> Lease:
        """Forget a lease whose shares all count 0 (waiting or freed). Raises ``ValueError``."""
        lease = self.leases[lease_id]
        for share in lease.shares.values():
            if counted_bytes(share):
                raise ValueError(f"lease {lease_id}: share on {share.card} still counts "
                                 f"{counted_bytes(share)} bytes in state {share.state}")
        self.earmark(lease_id, {})
        for pci, share in lease.shares.items():
            self._on_card[pci].pop(lease_id, None)
            self._active[pci].pop(lease_id, None)
            self._parked[pci] -= share.state is S.PARKED
            self._undrainable[pci] -= not lease.caps.drain
        return self.leases.pop(lease_id)

    def move(self, lease_id: str, pci: str, dst: ShareState, now: float, **changes) -> Share:
        """Move one share to ``dst`` (see :func:`berth.decide.model.move`) and apply ``changes`` to its
        fields in the same step, keeping the card's count exact. Raises ``IllegalTransition``."""
        share = self.leases[lease_id].shares[pci]
        before = counted_bytes(share)
        src = share.state
        move(share, dst, now)
        self._parked[pci] += (dst is S.PARKED) - (src is S.PARKED)
        if dst is S.ACTIVE:
            lease = self.leases[lease_id]
            self._active[pci][lease_id] = lease
            if src in (S.RESUMING, S.RETURNING):
                lease.resumed_at = max(lease.resumed_at, now)
        elif src is S.ACTIVE:
            self._active[pci].pop(lease_id, None)
        for k, v in changes.items():
            setattr(share, k, v)
        self._counted[pci] += counted_bytes(share) - before
        return share

    def update(self, lease_id: str, pci: str, **changes) -> Share:
        """Change a share's fields (``used_bytes``, ``reserved_bytes``, ...) without a move."""
        share = self.leases[lease_id].shares[pci]
        before = counted_bytes(share)
        for k, v in changes.items():
            setattr(share, k, v)
        self._counted[pci] += counted_bytes(share) - before
        return share

    def rehome(self, lease_id: str, moves: dict[str, str]) -> None:
        """Put a waiting lease's shares on other cards: ``moves`` maps each share's PCI
        address now to its new one (a permutation among the lease's shares may swap two).
        Its ``need_bytes`` and ``movable`` follow. Only a lease whose every share waits may
        move (it counts nothing anywhere); raises ``ValueError`` otherwise, ``KeyError`` for an
        unknown card. Issue 25: placement is decided at grant time.

        A parked lease that left nothing on its cards may move too (issue 35: a checkpoint
        restored onto another card, :attr:`~.model.Capabilities.restore_across`): its shares
        stay parked, counted on their new cards."""
        lease = self.leases[lease_id]
        if not (lease.is_waiting() or self.parked_away(lease)):
            raise ValueError(f"lease {lease_id}: only a waiting lease, or a parked one that "
                             f"left nothing on its cards, may move")
        moves = {a: b for a, b in moves.items() if a != b}
        if not moves:
            return
        for b in moves.values():
            if b not in self.cards:
                raise KeyError(f"lease {lease_id}: card {b!r} is not known")
        new_keys = [moves.get(p, p) for p in lease.shares]
        if len(set(new_keys)) != len(new_keys):
            raise ValueError(f"lease {lease_id}: two shares would go to one card")
        undrainable = not lease.caps.drain
        for p, sh in lease.shares.items():
            self._on_card[p].pop(lease_id, None)
            self._undrainable[p] = self._undrainable.get(p, 0) - undrainable
            self._counted[p] -= counted_bytes(sh)
            self._parked[p] -= sh.state is S.PARKED
        shares = {}
        for p, sh in lease.shares.items():
            sh.card = moves.get(p, p)
            shares[sh.card] = sh
            self._on_card[sh.card][lease_id] = lease
            self._undrainable[sh.card] = self._undrainable.get(sh.card, 0) + undrainable
            self._counted[sh.card] += counted_bytes(sh)
            self._parked[sh.card] += sh.state is S.PARKED
        lease.shares = shares
        lease.need_bytes = {moves.get(p, p): b for p, b in lease.need_bytes.items()}
        lease.movable = frozenset(moves.get(p, p) for p in lease.movable)

    @staticmethod
    def parked_away(lease: Lease) -> bool:
        """Every share of ``lease`` is parked and left nothing on its card (no residual, nothing
        lent): a checkpoint, which a restore may bring back on another card (issue 35)."""
        return bool(lease.shares) and all(
            sh.state is S.PARKED and not sh.residual_bytes and not sh.lent_bytes
            for sh in lease.shares.values())

    # -- earmarks -------------------------------------------------------------------------
    def earmark(self, lease_id: str, need: dict[str, int]) -> None:
        """Hold ``need`` ({pci: bytes}) free for waiter ``lease_id``; ``{}`` clears it."""
        for pci, b in self.earmarks.pop(lease_id, {}).items():
            self._earmarked[pci] -= b
        if need:
            self.earmarks[lease_id] = dict(need)
            for pci, b in need.items():
                self._earmarked[pci] += b

    # -- figures --------------------------------------------------------------------------
    def parked_on(self, pci: str) -> int:
        """How many parked shares the card holds."""
        return self._parked[pci]

    def counted(self, pci: str) -> int:
        """Σ counted bytes of every share on the card."""
        return self._counted[pci]

    def capacity(self, pci: str) -> int:
        """Bytes the card could count with no share on it: total − reserve − baseline − claims −
        stowaways (may be < 0). The one place card capacity is computed (seed 000 "budget")."""
        c = self.cards[pci]
        return c.capacity_bytes - c.stowaway_bytes

    def budget(self, pci: str) -> int:
        """:meth:`capacity` − Σ counted, in bytes (may be < 0)."""
        return self.capacity(pci) - self._counted[pci]

    def available(self, pci: str, for_lease: str | None = None,
                  outranked_bytes: int = 0) -> int:
        """Bytes that may be granted on ``pci`` to ``for_lease`` now.

        ``min(budget, driver free − reserve) − earmarks of other waiters + own``. Before the
        first driver read nothing is free (rule 1). May be negative. ``outranked_bytes``: the
        earmarks on ``pci`` of waiters ``for_lease`` ranks before (priority, then age), which do
        not hold against it: room goes to the best waiter when it appears, not to the one it
        was made for (issue 24).

        ``own`` is what ``for_lease`` already holds on the card while it waits: a host plugin
        adopts a process that its host started before Berth granted anything (supervisord's
        observe mode, issue 7). The broker counts such a process as a stowaway and the driver's
        free bytes leave it out, so granting the waiter its own bytes overlaps nothing (rule 2);
        without it, two engines started together could never both be leased.
        """
        c = self.cards[pci]
        if c.free_bytes is None:
            return min(0, self.budget(pci))
        room = min(self.budget(pci), c.free_bytes - c.reserve_bytes)
        held = self._earmarked[pci] - outranked_bytes
        own = 0
        if for_lease is not None:
            held -= self.earmarks.get(for_lease, {}).get(pci, 0)
            lease = self.leases.get(for_lease)
            sh = lease.shares.get(pci) if lease is not None else None
            if sh is not None and sh.state is S.WAITING and lease.pid is not None:
                own = max(0, sh.used_bytes or 0)
        return room - held + own

    def unfreeable(self, pci: str) -> int:
        """Bytes counted on ``pci`` by holders Berth can never free (a host it never stops,
        whose park frees nothing: :meth:`Lease.cannot_free`; issue 24)."""
        if not self._undrainable.get(pci):
            return 0
        return sum(counted_bytes(sh) for le, sh in self.active_on(pci)
                   if le.cannot_free() is not None)

    def unexplained(self, pci: str) -> int:
        """Bytes the last driver read shows used on ``pci`` that neither the baseline, the
        stowaways nor any share's count explains (``0`` before the first read): memory a
        process left behind that the driver has not freed yet (issue 24)."""
        c = self.cards[pci]
        if c.free_bytes is None:
            return 0
        return (c.total_bytes - c.baseline_bytes - c.stowaway_bytes - self._counted[pci]
                - c.free_bytes)

    def parked_in_ram_bytes(self, excluding: str | None = None) -> int:
        """Host bytes held by parked or parking shares (their size less the residual), those of
        lease ``excluding`` left out."""
        total = 0
        for lease in self.leases.values():
            if lease.id == excluding:
                continue
            for sh in lease.shares.values():
                if sh.state in (S.PARKED, S.PARKING, S.RESUMING):
                    total += max(0, max(sh.reserved_bytes, sh.parked_bytes) - sh.residual_bytes)
        return total

    def ram_available_bytes(self, for_lease: str | None = None) -> int | None:
        """The RAM budget less what parks hold (bytes; ``None``: no budget). ``for_lease``: the
        RAM that lease's own park may use: its parking bytes are left out here, because the
        park's own check asks for them (counting them on both sides refused every park whose
        engine the budget holds only once; issue 12 case 3)."""
        if self.ram_budget_bytes is None:
            return None
        return self.ram_budget_bytes - self.parked_in_ram_bytes(excluding=for_lease)

    def active_on(self, pci: str):
        """Yield ``(lease, share)`` for the active shares on the card (the ladder's candidates)."""
        for lease in list(self._active[pci].values()):
            yield lease, lease.shares[pci]

    def shares_on(self, pci: str):
        """Yield ``(lease, share)`` for every share on the card."""
        for lease in list(self._on_card[pci].values()):
            yield lease, lease.shares[pci]

    def view(self, pci: str) -> CardView:
        c = self.cards[pci]
        return CardView(pci=c.pci, name=c.name, total_bytes=c.total_bytes,
                        reserve_bytes=c.reserve_bytes, baseline_bytes=c.baseline_bytes,
                        stowaway_bytes=c.stowaway_bytes, claim_bytes=c.claim_bytes,
                        counted_bytes=self._counted[pci], budget_bytes=self.budget(pci),
                        free_bytes=c.free_bytes, available_bytes=self.available(pci),
                        earmarked_bytes=self._earmarked[pci])

    def check(self) -> None:
        """Recompute every cached figure; raise ``AssertionError`` on any mismatch."""
        counted = {pci: 0 for pci in self.cards}
        for lease in self.leases.values():
            for pci, sh in lease.shares.items():
                assert sh.card == pci, f"lease {lease.id}: share keyed {pci} names {sh.card}"
                counted[pci] += counted_bytes(sh)
        assert counted == self._counted, f"counted cache {self._counted} != {counted}"
        index = {pci: set() for pci in self.cards}
        for lease in self.leases.values():
            for pci in lease.shares:
                index[pci].add(lease.id)
        assert index == {p: set(d) for p, d in self._on_card.items()}, "card index is stale"
        parked = {pci: 0 for pci in self.cards}
        for lease in self.leases.values():
            for pci, sh in lease.shares.items():
                parked[pci] += sh.state is S.PARKED
        assert parked == self._parked, f"parked count {self._parked} != {parked}"
        active = {pci: set() for pci in self.cards}
        for lease in self.leases.values():
            for pci, sh in lease.shares.items():
                if sh.state is S.ACTIVE:
                    active[pci].add(lease.id)
        assert active == {p: set(d) for p, d in self._active.items()}, "active index is stale"
        marks = {pci: 0 for pci in self.cards}
        for need in self.earmarks.values():
            for pci, b in need.items():
                marks[pci] += b
        assert marks == self._earmarked, f"earmark cache {self._earmarked} != {marks}"
