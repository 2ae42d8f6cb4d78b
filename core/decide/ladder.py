"""Making room: a pure plan for a waiter that does not fit (seed 002 "Making room").

The rungs, cheapest first, are data (:data:`RUNGS`), not plugin load order:

1. ``fit``: it fits now; grant.
2. ``beside_residual``: it fits beside a parked residual; grant beside it.
3. ``lend``: a holder that can lend gives the waiter's size on that card, and keeps serving.
4. ``park``: holders sleep in RAM (hook or checkpoint), if the host RAM budget admits it.
5. ``drain``: holders stop (those that can park still park, if RAM admits them).

A card takes the first rung that works for it; a multi-card waiter gets a plan for every card or
none. Whether a holder has to make room at all is decided by :func:`displaceable` (priority,
minimum turn, hold, juggle guard); the rungs decide only how. Each :class:`Step` names its
fallback (rule 4: a park or lend that does not free the memory within the release grace falls
back to a drain).

A holder with requests in flight (its front reports them) is a victim of last resort, and its
park or drain waits for them to end (:attr:`Step.quiet_s`, what is left of its ``max_job``);
only a waiter of higher priority whose entry gives it the right (``may_preempt``) stops it at
once (issue 12 case 4). :class:`NoPlan` names what stands in the way (a holder with its priority
and jobs, a stowaway by PID, memory still being confirmed free, the reserve) and says whether
anything under way could change it (``lasting``; issue 12 case 6).

Pure: no I/O, no clock, no logging. Time is the ``now`` argument.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .admission import Policy, Waiter
from .causes import card_causes, quiet_bound_s
from .ledger import Ledger, counted_bytes, hook_residual_guess
from .model import Lease, ParkMechanism, ShareState
from .turns import SwapLog, displaceable
from .units import format_size

__all__ = ["Rung", "RUNGS", "Action", "Step", "Plan", "NoPlan", "plan", "expected_residual",
           "ram_cost"]

S = ShareState


class Rung(enum.StrEnum):
    FIT = "fit"
    BESIDE_RESIDUAL = "beside_residual"
    LEND = "lend"
    PARK = "park"
    DRAIN = "drain"
    MOVE = "move"       # a holder changes cards (issue 35; planned by berth.decide.moves)


#: The ladder's order: the cheapest way to make room first (seed 002 "Making room").
RUNGS: tuple[Rung, ...] = (Rung.FIT, Rung.BESIDE_RESIDUAL, Rung.LEND, Rung.PARK, Rung.DRAIN)


class Action(enum.StrEnum):
    LEND = "lend"
    PARK = "park"
    DRAIN = "drain"
    MOVE = "move"


_FALLBACK = {Action.LEND: Action.DRAIN, Action.PARK: Action.DRAIN, Action.DRAIN: None}
_RUNG_OF = {Action.LEND: Rung.LEND, Action.PARK: Rung.PARK, Action.DRAIN: Rung.DRAIN}


@dataclass(frozen=True)
class Step:
    """One holder making room. ``cards``: the PCI addresses it acts on (a park or drain acts on
    the whole lease; a lend on one card). ``lend_bytes``: N for a lend. ``frees_bytes``: what the
    ladder expects the step to take off each card's count. ``fallback``: the action to take if
    the step is not confirmed within the grace (``None`` for a drain). ``why``: for a drain of
    a holder that declared a park, why it is not parked (the host RAM budget). ``quiet_s``:
    how long its front may wait for its requests in flight first (seconds); ``jobs``: how many
    it had when the plan was made. ``fence_at``: see the field."""

    lease_id: str
    engine: str
    action: Action
    cards: tuple[str, ...]
    frees_bytes: dict[str, int]
    lend_bytes: int = 0
    fallback: Action | None = None
    why: str = ""
    quiet_s: float | None = None
    jobs: int = 0
    move_to: str | None = None      # a move's card (PCI address; issue 35)
    #: for a park or drain of a busy holder: when the waiter's oldest request arrived (broker's
    #: clock); while it waits for quiet its front forwards only the held requests older than
    #: that (issue 34, the fence)
    fence_at: float | None = None


@dataclass(frozen=True)
class Plan:
    """A way to make room for ``waiter`` (lease id): ``rung`` is the costliest rung used."""

    waiter: str
    rung: Rung
    steps: tuple[Step, ...] = ()


@dataclass(frozen=True)
class NoPlan:
    """No way to make room now. ``reason`` names what stood in the way per card; ``lasting``:
    nothing under way (a release being confirmed, a minimum turn running out, room being made)
    could change it, so a client held for it may be answered at once."""

    waiter: str
    reason: str
    lasting: bool = False



def expected_residual(lease: Lease, pci: str, policy: Policy) -> int:
    """Bytes the ladder expects a park to leave on ``pci``: none for a checkpoint; for a hook,
    the residual last measured for this lease, else ``policy.hook_residual_guess_bytes`` capped
    at half the share."""
    sh = lease.shares[pci]
    if lease.caps.park is ParkMechanism.CHECKPOINT:
        return 0
    if sh.residual_bytes:
        return sh.residual_bytes
    return hook_residual_guess(sh, policy.hook_residual_guess_bytes)


def _lendable(lease: Lease, pci: str) -> int:
    sh = lease.shares[pci]
    limit = lease.caps.lend_max_bytes
    if limit is None:
        limit = sh.reserved_bytes - sh.used_bytes if sh.used_bytes is not None \
            else sh.reserved_bytes // 2
    return max(0, min(limit, sh.reserved_bytes))


def ram_cost(lease: Lease, policy: Policy) -> int:
    """The host RAM a park of ``lease`` would hold (bytes): each share's counted bytes less the
    residual its park keeps on the card."""
    return sum(max(0, counted_bytes(sh) - expected_residual(lease, p, policy))
               for p, sh in lease.shares.items())


def plan(ledger: Ledger, w: Waiter, policy: Policy, now: float,
         swaps: SwapLog | None = None, busy_cards: frozenset[str] = frozenset(),
         fence: bool = False) -> Plan | NoPlan:
    """Plan room for waiter ``w`` (its ``need`` already computed) by the cheapest rungs.

    ``busy_cards``: cards on which room is already being made for another waiter; no plan is
    made on them. ``fence``: the plan is carried out (not only scored, as placement does), so
    a busy holder's park or drain is fenced at the waiter's oldest request (issue 34,
    :attr:`Step.fence_at`) and requests older than the waiter's keep no holder out of it;
    scored plans keep the older-requests rule, a card whose holder serves an older request
    being no room now. Returns :class:`Plan` (``rung`` ``fit``/``beside_residual`` with no
    steps when nothing need move) or :class:`NoPlan` with the reason. Per short card, numbered as the
    rungs: (3) one holder lends; else (4) holders park, then (5) drain, greedily in victim order.
    """
    waiter = ledger.leases[w.lease_id]
    short = {p: b - ledger.available(p, w.lease_id) for p, b in w.need.items()}
    short = {p: s for p, s in short.items() if s > 0}
    if not short:                                                                # (1), (2)
        return Plan(w.lease_id, Rung.BESIDE_RESIDUAL if _beside_residual(ledger, w) else Rung.FIT)
    if not waiter.makes_room:
        return NoPlan(w.lease_id, "; ".join(
            f"{ledger.cards[p].name}: short {format_size(gap)}" for p, gap in short.items())
            + f"; {waiter.engine} was drained and has no front to show a request for it: it "
              f"makes no room, and is granted when room frees (a holder stops or is drained "
              f"for another)")
    busy = [p for p in short if p in busy_cards]
    if busy:
        return NoPlan(w.lease_id, "room is already being made on "
                      + ", ".join(ledger.cards[p].name for p in busy))
    cands, refusals = _candidates(ledger, w, waiter, list(short), policy, now, swaps, fence)
    steps: dict[str, Step] = {}   # by lease id
    rung = Rung.FIT
    ram_left = ledger.ram_available_bytes()
    for p, gap in short.items():
        lend = _lend_step(waiter, p, w.need[p], gap, cands[p], steps, policy, now)    # (3)
        if lend is not None:
            steps[lend.lease_id] = lend
            rung = max(rung, Rung.LEND, key=RUNGS.index)
            continue
        chosen = _park_or_drain(waiter, p, gap, cands[p], steps, ram_left, policy, now,
                                _since(w, waiter) if fence else None)
        if chosen is None:
            causes = card_causes(ledger, p, waiter.id, gap, refusals.get(p, []))
            return NoPlan(w.lease_id, f"{ledger.cards[p].name}: short {format_size(gap)}; "
                          + "; ".join(c.text for c in causes),
                          lasting=all(c.lasting for c in causes)
                          or _beyond_reach(ledger, p, w.need[p], refusals.get(p, [])))
        for st in chosen:                                                        # (4), (5)
            steps[st.lease_id] = st
            rung = max(rung, _RUNG_OF[st.action], key=RUNGS.index)
            if st.action is Action.PARK and ram_left is not None:
                ram_left -= ram_cost(ledger.leases[st.lease_id], policy)
    return Plan(w.lease_id, rung, tuple(steps.values()))


def _beside_residual(ledger: Ledger, w: Waiter) -> bool:
    """Does the waiter fit beside a parked residual on one of its cards?"""
    return any(ledger.parked_on(p) and any(
        sh.state is S.PARKED and sh.reserved_bytes > sh.residual_bytes
        for _, sh in ledger.shares_on(p)) for p in w.need)


def _candidates(ledger: Ledger, w: Waiter, waiter: Lease, cards: list[str], policy: Policy,
                now: float, swaps: SwapLog | None, fence: bool = False
                ) -> tuple[dict[str, list[Lease]], dict[str, list[tuple[Lease, str, bool]]]]:
    """Per card: the active holders that may be displaced, in victim order (idle before busy,
    then lowest priority, then least recently used, then the largest), and
    ``(holder, reason, lasting)`` for those that may not."""
    refusals: dict[str, list[tuple[Lease, str, bool]]] = {}
    cands: dict[str, list[Lease]] = {}
    # The waiter has waited since its oldest request at its front (held while it sleeps),
    # which may be older than its place in the queue (a wake asked while it was parking).
    since = _since(w, waiter)
    ram = ledger.ram_available_bytes()
    for p in cards:
        found = []
        for lease, _sh in ledger.active_on(p):
            if lease.id == waiter.id:
                continue
            why, lasting = _unfreeable(lease, ram, policy)
            if why is None:
                why = displaceable(lease, waiter, policy, now, swaps, since, fence)
                # An operator hold stays; a turn and the guard run out, and so does a higher
                # priority's keep_warm when shorter than a held request's wait (counted from
                # now for a busy holder: its last request has not ended yet).
                warm_left = lease.keep_warm_s - (now - lease.last_used_at if lease.idle()
                                                 else 0.0)
                lasting = lease.held or (lease.priority > waiter.priority
                                         and warm_left > policy.wait_limit_s)
            if why is None:
                found.append(lease)
            else:
                refusals.setdefault(p, []).append((lease, why, lasting))
        found.sort(key=lambda le: (le.in_flight > 0, le.priority, le.last_used_at,
                                   -counted_bytes(le.shares[p])))
        cands[p] = found
    return cands, refusals


def _since(w: Waiter, waiter: Lease) -> float:
    """When the waiter's oldest request arrived (broker's clock): its place in the queue, or
    its front's oldest request when older (a wake asked while it was parking)."""
    return w.since if waiter.oldest_job_at is None else min(w.since, waiter.oldest_job_at)


def _beyond_reach(ledger: Ledger, p: str, need: int,
                  refusals: list[tuple[Lease, str, bool]]) -> bool:
    """Would ``need`` bytes stay out of reach on card ``p`` even if everything that can change
    did (every other holder gone, every release done)? Then the holders that stay for good
    (lasting refusals) decide alone, whatever else a wait names (issue 24)."""
    fixed = sum(counted_bytes(le.shares[p]) for le, _why, lasting in refusals if lasting)
    return fixed > 0 and need > ledger.capacity(p) - fixed


def _unfreeable(lease: Lease, ram: int | None, policy: Policy) -> tuple[str | None, bool]:
    """``(why, lasting)`` when Berth cannot free the holder's memory: it cannot be drained (an
    in-process host, rule 6) and has no park that frees anything (lasting), or its park does not
    fit the host RAM budget now (not lasting); ``(None, False)`` otherwise (issue 24)."""
    if lease.caps.drain:
        return None, False
    why = lease.cannot_free()
    if why is not None:
        return (f"Berth cannot free it: {why}; it is an in-process host, which Berth never "
                f"stops"), True
    if ram is not None and ram_cost(lease, policy) > ram:
        return (f"it can only park (an in-process host, which Berth never stops) and the host "
                f"RAM budget has {format_size(max(0, ram))} left for its "
                f"{format_size(ram_cost(lease, policy))}"), False
    return None, False


def _preempts(lease: Lease, waiter: Lease) -> bool:
    """May the waiter stop this busy holder at once (issue 12 case 4)?"""
    return lease.in_flight > 0 and waiter.may_preempt and waiter.priority > lease.priority


def _quiet(lease: Lease, waiter: Lease, policy: Policy, now: float) -> float:
    """How long the holder's front may wait for its jobs: what is left of its max_job,
    nothing when the waiter may preempt it (issue 12 case 4)."""
    if _preempts(lease, waiter):
        return 0.0
    return quiet_bound_s(lease, policy.max_job_s, now)


def _frees(lease: Lease, action: Action, policy: Policy) -> dict[str, int]:
    """Bytes the step takes off each card's count: all of it for a drain, all but the
    expected residual for a park."""
    if action is Action.DRAIN:
        return {p: counted_bytes(sh) for p, sh in lease.shares.items()}
    return {p: max(0, counted_bytes(sh) - expected_residual(lease, p, policy))
            for p, sh in lease.shares.items()}


def _lend_step(waiter: Lease, p: str, need: int, gap: int, cands: list[Lease],
               steps: dict[str, Step], policy: Policy, now: float) -> Step | None:
    """Rung (3): one holder gives the waiter's size on card ``p`` and keeps serving."""
    lender = next((le for le in cands if le.caps.can_lend() and le.id not in steps
                   and _lendable(le, p) >= need and not _preempts(le, waiter)), None)
    if lender is None or need < gap:
        return None
    return Step(lender.id, lender.engine, Action.LEND, (p,), {p: need}, lend_bytes=need,
                fallback=_FALLBACK[Action.LEND], quiet_s=_quiet(lender, waiter, policy, now),
                jobs=lender.in_flight)


def _park_or_drain(waiter: Lease, p: str, gap: int, cands: list[Lease], steps: dict[str, Step],
                   ram_left: int | None, policy: Policy, now: float,
                   since: float | None = None) -> list[Step] | None:
    """Rungs (4) then (5) on card ``p``: victims in order until ``gap`` bytes are freed, by
    parks alone if they can, else with drains, and last by draining every victim, for a card
    where the parks would leave residuals the waiter needs too; ``None`` when even that falls
    short."""
    for allow_drain, park_ok in ((False, True), (True, True), (True, False)):
        trial: dict[str, Step] = {}
        # Victims already chosen for an earlier card may span this one too.
        got = sum(st.frees_bytes.get(p, 0) for st in steps.values())
        ram = ram_left
        for le in cands:
            if got >= gap:
                break
            if le.id in steps:
                continue
            st = _victim_step(le, waiter, p, ram, allow_drain, park_ok, policy, now, since)
            if st is None:
                continue
            if st.action is Action.PARK and ram is not None:
                ram -= ram_cost(le, policy)
            trial[le.id] = st
            got += st.frees_bytes[p]
        if got >= gap:
            return list(_prune(trial, p, gap, got).values())
    return None


def _victim_step(le: Lease, waiter: Lease, p: str, ram: int | None, allow_drain: bool,
                 park_ok: bool, policy: Policy, now: float,
                 since: float | None = None) -> Step | None:
    """The holder's step: a park when parks are allowed (``park_ok``), it can park whole, is
    not preempted and the host RAM budget (``ram`` bytes left, ``None``: no limit) admits it;
    else a drain when allowed. A busy holder's step is fenced at ``since`` (issue 34) against
    a waiter of its own priority or lower, whom it serves in arrival order; a higher priority
    goes first, so its park closes the front at once and the holder's backlog stays held."""
    whole = all(sh.state is S.ACTIVE for sh in le.shares.values())
    why = ""
    if park_ok and le.caps.can_park() and whole and not _preempts(le, waiter) and (
            ram is None or ram_cost(le, policy) <= ram):
        action = Action.PARK
    elif allow_drain and le.caps.drain:
        action = Action.DRAIN
        if le.caps.can_park() and whole and not park_ok:
            why = (f"no park: it would leave {format_size(expected_residual(le, p, policy))} "
                   f"on the card, and the waiter needs that room too")
        elif le.caps.can_park() and whole:
            why = (f"no park: it would put {format_size(ram_cost(le, policy))} in host RAM "
                   f"and the RAM budget has {format_size(max(0, ram or 0))} left")
    else:
        return None
    f = _frees(le, action, policy)
    if f.get(p, 0) <= 0:
        return None
    return Step(le.id, le.engine, action, tuple(le.shares), f, fallback=_FALLBACK[action],
                why=why, quiet_s=_quiet(le, waiter, policy, now), jobs=le.in_flight,
                fence_at=since if le.in_flight and le.priority >= waiter.priority else None)


def _prune(trial: dict[str, Step], p: str, gap: int, got: int) -> dict[str, Step]:
    """Drop victims, most valuable first, while the rest still cover ``gap`` on ``p``."""
    for lid in reversed(list(trial)):
        f = trial[lid].frees_bytes.get(p, 0)
        if got - f >= gap:
            got -= f
            del trial[lid]
    return trial
