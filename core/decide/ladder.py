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
from dataclasses import dataclass, field

from .admission import Policy, Waiter
from .causes import card_causes, max_job_s, quiet_bound_s
from .demand import Forecast, forecast, own_clients
from .ledger import Ledger, counted_bytes, hook_residual_guess
from .model import Lease, ParkMechanism, ShareState
from .units import format_duration, format_size

__all__ = ["Rung", "RUNGS", "Action", "Step", "Plan", "NoPlan", "plan", "displaceable",
           "expected_residual", "SwapLog", "turn_start", "rent_s", "turn_end", "idle_forecast",
           "idle_for", "asked_since"]

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
    it had when the plan was made."""

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


@dataclass
class SwapLog:
    """Who took a card from whom and when, for the juggle guard: ``(taker, victim) -> [times]``
    by engine name (a drained engine comes back as a new lease under the same name)."""

    swaps: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def record(self, taker: str, victim: str, now: float) -> None:
        self.swaps.setdefault((taker, victim), []).append(now)

    def count(self, a: str, b: str, since: float) -> int:
        """Swaps between engines ``a`` and ``b``, either way, at or after ``since``."""
        return sum(1 for k in ((a, b), (b, a)) for t in self.swaps.get(k, ()) if t >= since)

    def prune(self, before: float) -> None:
        for k in list(self.swaps):
            kept = [t for t in self.swaps[k] if t >= before]
            if kept:
                self.swaps[k] = kept
            else:
                del self.swaps[k]


def displaceable(holder: Lease, waiter: Lease, policy: Policy, now: float,
                 swaps: SwapLog | None = None, since: float | None = None) -> str | None:
    """``None`` if ``holder`` may be made to give room to ``waiter`` now, else the reason.

    Numbered as in the code: (1) never itself; (2) an operator hold protects; (3) a holder of
    higher priority is not displaced while it serves or for its ``keep_warm_s`` after its last
    request (equal priority may be, as llama-swap swaps models; an idle high-priority engine can
    be parked for anyone once that runs out); (4) against a waiter of equal or lower priority
    only (a turn never holds back a higher priority), the holder's turn (:func:`_turn`): it is
    starting (idle or not, when the waiter asked after the request it loads for: issue 34),
    inside its minimum turn (less the cold start the waiter waited through, issue 34:
    :func:`_min_turn_end`), serving requests older than the waiter's, waiting for its first
    request, or inside its ``max_turn`` with demand (busy, or, against an equal priority, idle
    for less than its forecast keeps it: rent or buy, issue 24, with issue 34's forecast; never
    against a waiter whose request is older than any it expects; a higher priority's rent is
    its ``keep_warm``); (5) the juggle guard: two busy engines swap a card at most
    ``juggle_max_swaps`` times inside ``juggle_window_s``. ``since``: when the waiter's oldest
    request arrived (default: what its lease says, :func:`asked_since`).
    """
    if holder.id == waiter.id:                                               # (1)
        return "itself"
    if holder.held:                                                          # (2)
        return f"{holder.engine} is held"
    idle = holder.idle()
    if holder.priority > waiter.priority and (
            not idle or now - holder.last_used_at < holder.keep_warm_s):     # (3)
        return f"{holder.engine} has higher priority ({holder.priority} > {waiter.priority})"
    if holder.priority >= waiter.priority:                                   # (4)
        why = _turn(holder, waiter, policy, now, since)
        if why is not None:
            return why
    if not idle and swaps is not None and policy.juggle_max_swaps >= 0:      # (5)
        n = swaps.count(holder.engine, waiter.engine, now - policy.juggle_window_s)
        if n >= policy.juggle_max_swaps and holder.engine != waiter.engine:
            return (f"juggle guard: {holder.engine} and {waiter.engine} swapped {n} times "
                    f"in {policy.juggle_window_s:.0f}s")
    return None


def turn_start(holder: Lease, policy: Policy) -> tuple[float, bool]:
    """When the holder's turn began, and whether it has said it serves: once it said so after
    its grant (``ready_at``), or its last wake; an engine still loading is given up to
    ``wake_limit_s`` after its grant to get there."""
    said = holder.ready_at is not None and holder.ready_at >= (holder.granted_at or 0.0)
    ready = holder.ready_at if said else (holder.granted_at or 0.0) + policy.wake_limit_s
    return max(ready, holder.resumed_at), said or holder.resumed_at > 0.0


def rent_s(holder: Lease, waiter: Lease, policy: Policy) -> float:
    """What switching back would cost (seconds): the holder's measured restore or cold start
    plus the waiter's park (the holder's own while the waiter has not parked yet);
    ``policy.rent_fixed_s`` instead when it is set (>= 0)."""
    if policy.rent_fixed_s >= 0:
        return policy.rent_fixed_s
    return holder.switch_cost_s + (waiter.park_cost_s or holder.park_cost_s)


def turn_end(holder: Lease, policy: Policy, now: float,
             waiter: Lease | None = None, since: float | None = None) -> float | None:
    """When step (4) of :func:`displaceable` stops keeping the card for ``holder`` against an
    equal-priority waiter that asks at ``now`` with no park cost measured yet (the board's and
    ``berth status``'s "until", issue 29), on the broker's clock in seconds; ``None`` when the
    turn keeps it for nothing from ``now``. ``waiter``: that waiter when one is known (its
    client decides whether the holder's client waits on it, issue 34); ``None``: any waiter,
    with no causality known. ``since``: when the waiter's oldest request arrived (default:
    what its lease says, :func:`asked_since`). It follows :func:`_turn` case by case (a test
    holds the two together): a start for an older request, the first-request window, an idle
    holder's forecast (:func:`idle_forecast`: λ·rent, the rent, rent/λ; against an older
    request, the rent for expected demand inside its minimum turn, else nothing), the minimum
    turn, and a busy holder's turn up to ``max_turn`` while the
    front reports its jobs. A request the holder serves that is older than the waiter's keeps
    the card longer (up to ``max_job``)."""
    start, said = turn_start(holder, policy)
    longest = max(policy.max_turn_s, policy.min_turn_s, holder.switch_cost_s)
    since = asked_since(waiter, since) if waiter is not None else None
    if holder.idle():
        first = start + policy.first_request_s if said and (
            holder.last_job_at is None or holder.last_job_at < start) else 0.0
        if _starting_for_older(holder, now, start, since):
            first = start
        idle_from = max(holder.idle_since if holder.idle_since is not None else now,
                        start if said else 0.0)
        fc = idle_forecast(holder, waiter or holder, policy, waiter is not None, now, since)
        end = max(first, min(idle_from + fc.keep_s, start + longest))
        if fc.turn_keep_s > 0:
            end = max(end, min(idle_from + fc.turn_keep_s,
                               _min_turn_end(holder, policy, start, since, waiter)))
    else:
        end = _min_turn_end(holder, policy, start, since, waiter)
        if holder.jobs_reported:
            outlives = holder.oldest_job_at + max_job_s(holder, policy.max_job_s) \
                if holder.oldest_job_at is not None else start + longest
            end = max(end, min(start + longest, outlives))
    return end if end > now else None


def idle_for(holder: Lease, policy: Policy, now: float) -> float:
    """How long an idle holder has been idle at ``now`` (seconds), counted from its turn's
    start at the earliest (a wake's idle spell starts when it serves again)."""
    start, said = turn_start(holder, policy)
    return now - max(holder.idle_since if holder.idle_since is not None else now,
                     start if said else 0.0)


def idle_forecast(holder: Lease, waiter: Lease, policy: Policy,
                  known: bool = True, now: float | None = None,
                  since: float | None = None) -> Forecast:
    """An idle holder's forecast against ``waiter`` (:func:`.demand.forecast`): how long from
    the start of its idle spell it keeps the card (``keep_s``), with the rent (what a switch
    back would cost, :func:`rent_s`) and the evidence. ``known``: the waiter's client is known
    (else no causality is looked for). With ``now``, the waiter's request age counts too
    (``since``, default :func:`asked_since`): against a request older than any the holder
    expects, it keeps nothing (issue 34: the older request first)."""
    longest = max(policy.max_turn_s, policy.min_turn_s, holder.switch_cost_s)
    idle_from = None if now is None else now - idle_for(holder, policy, now)
    if known and now is not None:
        since = asked_since(waiter, since)
    return forecast(holder, waiter if known else None, policy, rent_s(holder, waiter, policy),
                    longest, idle_from, since if known else None)


def asked_since(waiter: Lease, since: float | None = None) -> float | None:
    """When the waiter's oldest request arrived (broker's clock): ``since`` when the caller
    knows it (the ladder's: its queue entry, or its front's oldest request if older), else its
    front's oldest request, else the request that asked for its grant or wake; ``None`` when
    none is known."""
    if since is not None:
        return since
    return waiter.oldest_job_at if waiter.oldest_job_at is not None else waiter.demand.asked_at


def _starting_for_older(holder: Lease, now: float, start: float, since: float | None) -> bool:
    """Issue 34: a holder still starting (granted, not yet said it serves) loads for the
    request that asked for it; a waiter that asked after that request does not take its card
    before it has served it (a manager such as llama-swap holds that request until its health
    poll, so the front has none to report, and a park planned then took effect before it and
    cost it a whole switch back: 57 s on ``bench/policy``'s n and o shapes)."""
    return now < start and (since is None or since >= holder.requested_at)


def _min_turn(holder: Lease, policy: Policy) -> float:
    """A turn is worth at least what the switch into it cost (issue 16: cost-aware turns)."""
    return max(policy.min_turn_s, holder.switch_cost_s)


def batches(waiter: Lease) -> bool:
    """Whether making ``waiter`` wait out the holder's minimum turn can batch its requests
    (issue 34, third pass). Not when its oldest request came from a client whose last answer
    came from another engine (:attr:`~.model.Demand.asked_moved`) and it has no clients of its
    own (:func:`.demand.own_clients`): that client moves between engines and sends its next
    request only after this one's answer, so however long it waits, its turn serves that one
    request. Keeping the card then saves no switch (the switch pair happens whenever the
    turn comes) and only adds the turn to its wait: ``bench/policy``'s m, where the
    alternating client's request for B waited A's turn (B's p95 12.8-16.5 s against
    llama-swap's 11.5-12.4 s on 4 of seeds 1-10)."""
    return not (waiter.demand.asked_moved is True and not own_clients(waiter.demand))


def _min_turn_end(holder: Lease, policy: Policy, start: float, since: float | None,
                  waiter: Lease | None = None) -> float:
    """When the holder's minimum turn ends against a waiter whose oldest request arrived at
    ``since`` (broker's clock, seconds). A waiter that asked while the holder was still cold
    starting has waited through the load that began its turn (``switch_cost_s``, measured):
    that wait counts towards the turn (issue 34), so it waits the minimum turn, not the load
    and then the whole turn. Measured: the second client of bursty ping-pong (``bench/policy``
    o) waited a cold start, the first engine's whole 10 s turn and its own cold start (25-31 s,
    where llama-swap's FIFO made it wait 23 s). A wake's turn keeps all of it: two busy clients
    batch by turns after every wake, and a live wake under load (20-30 s) credited this way left
    no turn at all (one switch per request: 16 answered in 90 s at a load of 12)."""
    end = start + _min_turn(holder, policy)
    cold = holder.ready_at is None or holder.ready_at >= holder.resumed_at
    if cold and since is not None and since < start:
        # Never before its first request can reach it: a manager's health poll hands that
        # request over up to a poll after the engine is ready, and until then a fresh front
        # has reported nothing (counted busy), so no other rule keeps it (llama-swap's
        # fresh engine drained before its poll, issue 24).
        end = max(start + policy.first_request_s, end - holder.switch_cost_s)
    if waiter is not None and not batches(waiter):
        # The turn saves no switch against it: only a fresh engine's wait for its first
        # request is kept (see above), until that request has come.
        first = cold and (holder.last_job_at is None or holder.last_job_at < start)
        end = min(end, start + (policy.first_request_s if first else 0.0))
    return end


_STARTING = "{} is starting: it has not said it serves yet (given up to {} after its grant)"


def _turn(holder: Lease, waiter: Lease, policy: Policy, now: float,
          since: float | None) -> str | None:
    """Step (4) of :func:`displaceable`: why the holder's turn keeps its card, or ``None``."""
    start, said = turn_start(holder, policy)
    longest = max(policy.max_turn_s, policy.min_turn_s, holder.switch_cost_s)
    since = asked_since(waiter, since)
    if _starting_for_older(holder, now, start, since):
        return _STARTING.format(holder.engine, format_duration(policy.wake_limit_s))
    if holder.idle():
        # An idle holder yields once its idle spell outlasts a switch back (rent or buy:
        # never worse than twice the best choice in hindsight), or its turn is over, or at
        # once to a request older than any it expects (issue 34).
        # The words stay the same while the reason does: a changed wait wakes every poll.
        if said and now - start < policy.first_request_s and (
                holder.last_job_at is None or holder.last_job_at < start):
            return (f"{holder.engine} has just become ready and waits up to "
                    f"{format_duration(policy.first_request_s)} for its first request (a "
                    f"manager's health poll)")
        idle_s = idle_for(holder, policy, now)
        # How long it keeps the card idle is what its forecast says (issue 34: λ·rent with no
        # demand expected, rent/λ with some, the rent with no forecast).
        # A higher priority's rent is its keep_warm, which (3) has counted already.
        fc = idle_forecast(holder, waiter, policy, now=now, since=since)
        if holder.priority == waiter.priority and idle_s < fc.keep_s and now - start < longest:
            return f"{fc.words(holder.engine)}; its turn lasts at most " \
                   f"{format_duration(longest)}"
        # Against an older request, demand keeps it only inside its minimum turn (issue 34).
        if holder.priority == waiter.priority and idle_s < fc.turn_keep_s and \
                now < _min_turn_end(holder, policy, start, since, waiter):
            return (f"{holder.engine} is inside its minimum turn and expects a request within "
                    f"a switch back ({format_duration(fc.rent_s)})")
        return None
    if now < start:        # no turn has begun: it has not said it serves (even at 0s)
        return _STARTING.format(holder.engine, format_duration(policy.wake_limit_s))
    # A turn is worth at least what the switch into it cost (issue 16: cost-aware turns).
    if now < _min_turn_end(holder, policy, start, since, waiter):
        return f"{holder.engine} is inside its minimum turn"
    # Older requests keep the card only while the oldest is younger than the holder's max_job
    # (a job that outlived it protects nothing, as in the park's wait for quiet).
    if since is not None and holder.oldest_job_at is not None and \
            holder.oldest_job_at < since and \
            now - holder.oldest_job_at < max_job_s(holder, policy.max_job_s):
        return f"{holder.engine} serves requests older than {waiter.engine}'s"
    # Batching needs known demand: a front that never reported keeps only its minimum turn,
    # and a job that outlived the holder's max_job protects nothing here either.
    outlived = holder.oldest_job_at is not None and \
        now - holder.oldest_job_at >= max_job_s(holder, policy.max_job_s)
    if holder.jobs_reported and not outlived and now - start < longest:
        return (f"{holder.engine} serves its turn (its backlog first, at most "
                f"{format_duration(longest)})")
    return None


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


def _ram_cost(lease: Lease, policy: Policy) -> int:
    return sum(max(0, counted_bytes(sh) - expected_residual(lease, p, policy))
               for p, sh in lease.shares.items())


def plan(ledger: Ledger, w: Waiter, policy: Policy, now: float,
         swaps: SwapLog | None = None, busy_cards: frozenset[str] = frozenset()) -> Plan | NoPlan:
    """Plan room for waiter ``w`` (its ``need`` already computed) by the cheapest rungs.

    ``busy_cards``: cards on which room is already being made for another waiter; no plan is
    made on them. Returns :class:`Plan` (``rung`` ``fit``/``beside_residual`` with no steps when
    nothing need move) or :class:`NoPlan` with the reason. Per short card, numbered as the
    rungs: (3) one holder lends; else (4) holders park, then (5) drain, greedily in victim order.
    """
    waiter = ledger.leases[w.lease_id]
    short = {p: b - ledger.available(p, w.lease_id) for p, b in w.need.items()}
    short = {p: s for p, s in short.items() if s > 0}
    if not short:                                                                # (1), (2)
        return Plan(w.lease_id, Rung.BESIDE_RESIDUAL if _beside_residual(ledger, w) else Rung.FIT)
    busy = [p for p in short if p in busy_cards]
    if busy:
        return NoPlan(w.lease_id, "room is already being made on "
                      + ", ".join(ledger.cards[p].name for p in busy))
    cands, refusals = _candidates(ledger, w, waiter, list(short), policy, now, swaps)
    steps: dict[str, Step] = {}   # by lease id
    rung = Rung.FIT
    ram_left = ledger.ram_available_bytes()
    for p, gap in short.items():
        lend = _lend_step(waiter, p, w.need[p], gap, cands[p], steps, policy, now)    # (3)
        if lend is not None:
            steps[lend.lease_id] = lend
            rung = max(rung, Rung.LEND, key=RUNGS.index)
            continue
        chosen = _park_or_drain(waiter, p, gap, cands[p], steps, ram_left, policy, now)
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
                ram_left -= _ram_cost(ledger.leases[st.lease_id], policy)
    return Plan(w.lease_id, rung, tuple(steps.values()))


def _beside_residual(ledger: Ledger, w: Waiter) -> bool:
    """Does the waiter fit beside a parked residual on one of its cards?"""
    return any(ledger.parked_on(p) and any(
        sh.state is S.PARKED and sh.reserved_bytes > sh.residual_bytes
        for _, sh in ledger.shares_on(p)) for p in w.need)


def _candidates(ledger: Ledger, w: Waiter, waiter: Lease, cards: list[str], policy: Policy,
                now: float, swaps: SwapLog | None
                ) -> tuple[dict[str, list[Lease]], dict[str, list[tuple[Lease, str, bool]]]]:
    """Per card: the active holders that may be displaced, in victim order (idle before busy,
    then lowest priority, then least recently used, then the largest), and
    ``(holder, reason, lasting)`` for those that may not."""
    refusals: dict[str, list[tuple[Lease, str, bool]]] = {}
    cands: dict[str, list[Lease]] = {}
    # The waiter has waited since its oldest request at its front (held while it sleeps),
    # which may be older than its place in the queue (a wake asked while it was parking).
    since = w.since if waiter.oldest_job_at is None else min(w.since, waiter.oldest_job_at)
    ram = ledger.ram_available_bytes()
    for p in cards:
        found = []
        for lease, _sh in ledger.active_on(p):
            if lease.id == waiter.id:
                continue
            why, lasting = _unfreeable(lease, ram, policy)
            if why is None:
                why = displaceable(lease, waiter, policy, now, swaps, since)
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
    if ram is not None and _ram_cost(lease, policy) > ram:
        return (f"it can only park (an in-process host, which Berth never stops) and the host "
                f"RAM budget has {format_size(max(0, ram))} left for its "
                f"{format_size(_ram_cost(lease, policy))}"), False
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
                   ram_left: int | None, policy: Policy, now: float) -> list[Step] | None:
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
            st = _victim_step(le, waiter, p, ram, allow_drain, park_ok, policy, now)
            if st is None:
                continue
            if st.action is Action.PARK and ram is not None:
                ram -= _ram_cost(le, policy)
            trial[le.id] = st
            got += st.frees_bytes[p]
        if got >= gap:
            return list(_prune(trial, p, gap, got).values())
    return None


def _victim_step(le: Lease, waiter: Lease, p: str, ram: int | None, allow_drain: bool,
                 park_ok: bool, policy: Policy, now: float) -> Step | None:
    """The holder's step: a park when parks are allowed (``park_ok``), it can park whole, is
    not preempted and the host RAM budget (``ram`` bytes left, ``None``: no limit) admits it;
    else a drain when allowed."""
    whole = all(sh.state is S.ACTIVE for sh in le.shares.values())
    why = ""
    if park_ok and le.caps.can_park() and whole and not _preempts(le, waiter) and (
            ram is None or _ram_cost(le, policy) <= ram):
        action = Action.PARK
    elif allow_drain and le.caps.drain:
        action = Action.DRAIN
        if le.caps.can_park() and whole and not park_ok:
            why = (f"no park: it would leave {format_size(expected_residual(le, p, policy))} "
                   f"on the card, and the waiter needs that room too")
        elif le.caps.can_park() and whole:
            why = (f"no park: it would put {format_size(_ram_cost(le, policy))} in host RAM "
                   f"and the RAM budget has {format_size(max(0, ram or 0))} left")
    else:
        return None
    f = _frees(le, action, policy)
    if f.get(p, 0) <= 0:
        return None
    return Step(le.id, le.engine, action, tuple(le.shares), f, fallback=_FALLBACK[action],
                why=why, quiet_s=_quiet(le, waiter, policy, now), jobs=le.in_flight)


def _prune(trial: dict[str, Step], p: str, gap: int, got: int) -> dict[str, Step]:
    """Drop victims, most valuable first, while the rest still cover ``gap`` on ``p``."""
    for lid in reversed(list(trial)):
        f = trial[lid].frees_bytes.get(p, 0)
        if got - f >= gap:
            got -= f
            del trial[lid]
    return trial
