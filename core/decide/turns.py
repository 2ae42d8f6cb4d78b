"""Whose turn it is: whether a holder must make room for a waiter now, and when its turn ends
(seed 002 "Making room"; issues 16, 24 and 34).

:func:`displaceable` is the ladder's gate (:mod:`.ladder` decides only how room is made):
priority, an operator hold, the holder's turn (:func:`turn_end`: the first-request window, the
minimum turn, its backlog of older requests, the rent an idle holder's forecast keeps it for)
and the juggle guard (:class:`SwapLog`). The scheduler, the status and the reports read the same
turn ends, so what ``berth status`` says a holder keeps its card for is what the ladder does.

Pure: no I/O, no clock, no logging. Time is the ``now`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .admission import Policy
from .causes import max_job_s
from .demand import Forecast, forecast, own_clients
from .model import Lease
from .units import format_duration

__all__ = ["SwapLog", "displaceable", "turn_start", "rent_s", "turn_end", "idle_forecast",
           "idle_for", "asked_since", "batches"]

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
                 swaps: SwapLog | None = None, since: float | None = None,
                 fence: bool = False) -> str | None:
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
    request arrived (default: what its lease says, :func:`asked_since`). ``fence``: the caller's
    park or drain fences the holder's front at ``since`` (issue 34: it forwards only the held
    requests older than the waiter's, and the park waits for those), so requests older than the
    waiter's no longer keep the card from being planned.
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
        why = _turn(holder, waiter, policy, now, since, fence)
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
          since: float | None, fence: bool = False) -> str | None:
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
    # (a job that outlived it protects nothing, as in the park's wait for quiet). A holder
    # whose front holds requests is parked fenced instead, the park waiting for the older
    # ones: the instant they end its front would forward the held ones, newer than the
    # waiter's, and a park decided then would wait for those too (issue 34, the fence).
    if not (fence and holder.held_jobs) and since is not None and \
            holder.oldest_job_at is not None and \
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
