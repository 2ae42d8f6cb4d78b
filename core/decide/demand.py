"""Predicted demand: will a request for an idle holder come within what a switch back costs?

Source: issue 34. An idle holder against an equal-priority waiter is a ski rental (issue 24):
keeping the card costs the waiter its wait, giving it up costs a switch back if the holder is
asked for again. The plain rule (keep it for as long as a switch back would cost, the rent) is
2-competitive and pays double exactly in the everyday case: one person alternating two models,
whose only client is the very one now waiting on the other engine. A prediction gets past that
bound; learning-augmented ski rental (Purohit, Svitkina and Kumar, NeurIPS 2018) keeps it safe
when it is wrong, with a trust parameter λ (``Policy.demand_trust``): an idle holder forecast
to see **no demand** yields after λ·rent; one forecast to see **demand** keeps its card until
rent/λ (its turn's ``max_turn`` caps it); with no forecast it keeps the plain rent. Right, the
cost is at most (1+λ) times the best choice in hindsight; wrong, at most (1+1/λ) times. Each
holder's own record of wrong forecasts (:attr:`~.model.Demand.error`) raises its λ towards 1,
where the rule is the plain rent again, so a predictor that keeps being wrong stops costing.

A **demand** forecast is checked on the spot: idle past the rent without a request it is
wrong, and a wrong forecast falls back to the plain rent, so it keeps the rent (measured:
keeping up to twice the rent cost ``f-fresh-engine``, whose clients stop, a tenth of its p95,
and won nothing elsewhere); it changes the words and the error record.

λ = 0 by default: a forecast of no demand yields at once. A positive λ costs every switch of
one person alternating two models λ·rent (40-150 ms for a 14 GiB checkpoint, beside a
pipeline that aims at 100 ms), and with λ = 0.1 or 1 the simulator's workloads wait as long or
longer (``bench/policy/run.py --knob demand_trust=λ``); the error record bounds the loss
instead: one wrong forecast costs one switch back and puts that holder's λ at 1/2 or more.

The forecast (:func:`forecast`), numbered as in the code, from what the holder's front and the
waiter's front saw (:class:`~.model.Demand`, on the broker's clock):

1. causality of a closed loop: the waiter's request arrived after the holder's last answer
   ended, from the client key that answer went to. A closed-loop client sends its next
   request only after its answer, so that client now waits on the waiter and cannot ask the
   holder anything before the waiter has served it: **no demand**, unless the holder's history
   shows clients of its own (2). A waiter that was already waiting while the holder served
   (two clients taking turns) is not that.
2. its arrival history: requests for it whose client's last answer came from it (clients of
   its own, not a client that moved from another engine) mean the holder has demand a move of
   one client does not end; (1) is then left to the gaps (3). On loopback every client has one
   address; this tells a busy client from one that alternates behind it.
3. the gaps between its requests: the median of its last idle gaps (an answer's end to the next
   request's arrival) under the rent is **demand**, over it **no demand**.
4. nothing known: no forecast, the plain rent.

**The older request first** (issue 34's yardstick): whatever the forecast, an idle holder keeps
its card against a waiter only for a request older than the waiter's. Idle, it has none; the
one it expects (demand: its idle spell's start plus the median gap) is older only when it was
due before the waiter asked (its client is late, not gone), and with no forecast nothing is
expected at all. Otherwise the waiter's request is the oldest (``Forecast.older``): once the holder's minimum
turn (``max(min_turn, switch cost)``) is over it gets the card at once, the order FIFO peers
serve in (llama-swap v250 swaps as soon as the holder has nothing in flight). Inside its
minimum turn a holder that expects demand (a demand forecast, or none yet) still keeps its card
for it (``Forecast.turn_keep_s``): the minimum turn protects a holder only while it has demand,
and it is what batches two busy clients (live, a switch of two 14 GiB checkpoints takes about
7 s; one switch per request answered 14 requests in 90 s where turns answer over 45). Keeping
an idle card for a later request of the holder's own busy client up to ``max_turn`` had made
the waiter wait out every short idle gap, on every seed of ``bench/policy``'s ping-pong and
busy-beside shapes (their longest wait 1.2-2x the peer's).

Pure: no I/O, no clock, no logging. Times are arguments.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from .admission import Policy
from .model import DEMAND_KEEP, Demand, Lease
from .units import format_duration

__all__ = ["Outlook", "Forecast", "forecast", "trust", "follows", "own_clients",
           "CAUSAL_SLACK_S", "recent",
           "RECENT_WINDOW_S",
           "arrived", "answered", "yielded", "moved_from", "settle", "ERROR_WEIGHT", "MIN_SAMPLES"]

#: Seconds a waiter's request may seem to precede the holder's answer and still count as sent
#: after it: both times cross from a run as ages, each off by its report's trip to berthd.
CAUSAL_SLACK_S = 0.25

#: How much one outcome moves a holder's error rate (an exponential average): one wrong
#: forecast halves the trust's distance to the plain rent's, one right one halves the error.
ERROR_WEIGHT = 0.5

#: Samples a history needs before it forecasts (one gap or two are anecdotes: an engine's
#: first gap is often the wait for its first client).
MIN_SAMPLES = 3


class Outlook(enum.StrEnum):
    NONE = "none"          # no request expected within a switch back
    DEMAND = "demand"      # a request expected within a switch back
    UNKNOWN = "unknown"    # no forecast: the plain rent


@dataclass(frozen=True)
class Forecast:
    """What an idle holder's turn does against a waiter. ``outlook``; ``why``: the evidence in
    words (``"its client is waiting on B"``); ``rent_s``: what a switch back would cost;
    ``keep_s``: how long from the start of its idle spell it keeps the card (seconds; λ·rent,
    rent/λ capped by ``longest_s``, or the rent); ``trust``: the λ used (the policy's, raised by
    the holder's error rate)."""

    outlook: Outlook
    why: str
    rent_s: float
    keep_s: float
    trust: float
    older: str = ""     # the waiter whose older request ends the keep at once (its engine)
    turn_keep_s: float = 0.0    # the keep an older request leaves it inside its minimum turn

    def words(self, holder: str) -> str:
        """The holder's turn in words, for the board and a waiter's reason: ``"A yields at
        once: its client is waiting on B"``. Stable while the evidence is (a changed reason
        wakes every poll)."""
        if self.older:
            expects = "the request it expects" if self.outlook is Outlook.DEMAND else \
                "any request it may get"
            return f"{holder} yields at once: {self.older}'s request is older than {expects}"
        if self.outlook is Outlook.NONE:
            when = "at once" if self.keep_s < 0.05 else \
                f"after {format_duration(self.keep_s)} idle"
            return f"{holder} yields {when}: {self.why}"
        if self.outlook is Outlook.DEMAND:
            return (f"{holder} keeps its card up to {format_duration(self.keep_s)} idle for a "
                    f"request expected within a switch back ({format_duration(self.rent_s)}): "
                    f"{self.why}")
        return (f"{holder} keeps its card while idle for less than a switch back would cost "
                f"({format_duration(self.rent_s)})")


def trust(holder: Lease, policy: Policy) -> float:
    """λ for this holder: the policy's ``demand_trust``, raised towards 1 (the plain rent) by
    the holder's record of wrong forecasts."""
    lam = min(1.0, max(0.0, policy.demand_trust))
    return lam + (1.0 - lam) * min(1.0, max(0.0, holder.demand.error))


def follows(holder: Lease, waiter: Lease) -> bool:
    """Step (1): the waiter's oldest request came after the holder's last answer, from the
    client key that answer went to. (Not only an answer of this turn: a woken engine's front
    may answer before berthd hears that the wake is done.)"""
    d, w = holder.demand, waiter.demand
    return (w.asked_client is not None and w.asked_client == d.answered_client
            and d.answered_at is not None
            and w.asked_at is not None and w.asked_at >= d.answered_at - CAUSAL_SLACK_S)


def own_clients(d: Demand) -> bool:
    """Step (2): at least half of its recent arrivals while others held the card came from
    clients of its own (none of another engine's answers led to them)."""
    own = sum(1 for moved in d.moved if not moved)
    return len(d.moved) >= MIN_SAMPLES and 2 * own >= len(d.moved)


def forecast(holder: Lease, waiter: Lease | None, policy: Policy, rent: float,
             longest_s: float, idle_from: float | None = None,
             since: float | None = None) -> Forecast:
    """The idle ``holder``'s forecast against ``waiter`` (``None``: a waiter not known yet,
    so no causality), numbered as in the module docstring. ``rent``: what a switch back would
    cost (seconds); ``longest_s``: its turn's cap (``max_turn``). ``idle_from``: when its idle
    spell began and ``since``: when the waiter's oldest request arrived (broker's clock): with
    both, a waiter whose request is older than any the holder expects gets the card at once
    (the older request first, see the module docstring)."""
    lam = trust(holder, policy)
    d = holder.demand

    def out(outlook: Outlook, why: str) -> Forecast:
        if outlook is Outlook.NONE:
            keep = lam * rent
        elif outlook is Outlook.DEMAND:
            # rent/λ, but checked on the spot: idle past the rent without a request, the
            # forecast is already wrong, and a wrong forecast falls back to the plain rent.
            keep = min(rent / max(lam, 1.0), max(rent, longest_s))
        else:
            keep = rent
        if keep > 0 and waiter is not None and idle_from is not None and since is not None \
                and (outlook is not Outlook.DEMAND or idle_from + _median(d.gaps) > since):
            return Forecast(outlook, why, rent, 0.0, lam, older=waiter.engine,
                            turn_keep_s=keep if outlook is not Outlook.NONE else 0.0)
        return Forecast(outlook, why, rent, keep, lam)

    own = own_clients(d)
    if waiter is not None and follows(holder, waiter) and not own:                  # (1)
        return out(Outlook.NONE, f"its client is waiting on {waiter.engine}")
    if len(d.gaps) >= MIN_SAMPLES:                                                  # (2), (3)
        gap = _median(d.gaps)
        if gap < rent:
            return out(Outlook.DEMAND, f"its requests come back after {format_duration(gap)} "
                                       f"idle (median)")
        return out(Outlook.NONE, f"its requests come {format_duration(gap)} after its "
                                 f"answers (median), more than a switch back")
    return out(Outlook.UNKNOWN, "")                                                 # (4)


#: The window :func:`recent` counts a lease's arrivals over (seconds): a quarter of an hour,
#: several sessions of an engine asked for every few minutes (issue 35).
RECENT_WINDOW_S = 900.0


def recent(lease: Lease, now: float, window_s: float = RECENT_WINDOW_S) -> int:
    """How much ``lease`` is asked for lately (issue 35): the requests that came to its front
    when it had none (:func:`arrived`) in the last ``window_s`` seconds before ``now`` (the
    broker's clock), plus one while it serves. Each is a request that waits for a switch back
    if the lease is parked or drained between two of them."""
    return sum(1 for t in lease.demand.arrivals if now - t <= window_s) + (not lease.idle())


def _median(xs: Iterable[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def answered(lease: Lease, client: str | None, at: float | None) -> None:
    """Its front's last answer ended at ``at`` (broker's clock), delivered to ``client``."""
    if at is None:
        return
    d = lease.demand
    if d.answered_at is None or at >= d.answered_at:
        d.answered_client, d.answered_at = client, at
    if client is not None and at >= d.answers.get(client, at):
        d.answers.pop(client, None)         # re-inserted last: the dict keeps answer order
        d.answers[client] = at
        while len(d.answers) > DEMAND_KEEP:
            d.answers.pop(next(iter(d.answers)))


def arrived(lease: Lease, client: str | None, at: float,
            kept: Forecast | None = None, moved: bool | None = None,
            holds: bool = False, asked_moved: bool | None = None) -> None:
    """A request for ``lease`` arrived at ``at`` (broker's clock) from ``client`` at a front
    that had none. Records its idle gap and settles the forecast ``kept`` that kept it idle
    for a waiter (right when it said demand, wrong when it said none). Whether its client moved
    here (:func:`moved_from`): ``moved`` when it ``holds`` its card (a client of its own, most
    often), else told later (:func:`settle`), once the engine it moved from has reported its
    answer. A second word of the same arrival (the wake's, then the jobs report's) records
    nothing more."""
    d = lease.demand
    if d.asked_at is not None:
        d.asked_client = client if client is not None else d.asked_client
        d.asked_moved = d.asked_moved if asked_moved is None else asked_moved
        return
    d.asked_client, d.asked_at, d.asked_moved = client, at, asked_moved
    d.arrivals.append(at)
    if d.answered_at is not None and at >= d.answered_at:
        d.gaps.append(at - d.answered_at)
    if kept is not None and kept.outlook is not Outlook.UNKNOWN:
        _outcome(d, wrong=kept.outlook is Outlook.NONE)
    if holds:
        if moved is not None:
            d.moved.append(moved)
    else:
        d.unsettled = True


def settle(lease: Lease, leases: Iterable[Lease]) -> None:
    """``lease`` gets the card back (a grant or a wake): whether the request it asked for
    moved here (:func:`moved_from`, among ``leases``) joins its arrival history, and settles
    the **no demand** forecast it last yielded under: wrong when that request came within the
    rent from a client that did not move here (one that did was served on the waiter first:
    the alternation going on, not demand the yield cost). Settled here, not at the arrival:
    the holder it moved from may report its answer after the wake."""
    d = lease.demand
    if d.asked_at is None or not d.unsettled:
        return
    d.unsettled = False
    moved = moved_from(leases, lease, d.asked_client, d.asked_at)
    if moved is not None:
        d.moved.append(moved)
    if d.pending is not None:
        idle_from, rent = d.pending
        d.pending = None
        _outcome(d, wrong=d.asked_at - idle_from < rent and moved is not True)


def moved_from(leases: Iterable[Lease], lease: Lease, client: str | None,
               at: float) -> bool | None:
    """Whether a request of ``client`` arriving at ``lease`` at ``at`` comes from a client
    whose last answer (before ``at``) came from another engine (``True``: it moves between
    engines), or from this one (``False``: a client of its own); ``None`` when the client is
    unknown or no answer to it is known."""
    if client is None:
        return None
    last: tuple[float, bool] | None = None
    for le in leases:
        d = le.demand
        t = d.answers.get(client, d.answered_at if d.answered_client == client else None)
        if t is not None and t <= at + CAUSAL_SLACK_S and (last is None or t > last[0]):
            last = (t, le.id != lease.id)
    return None if last is None else last[1]


def yielded(lease: Lease, fc: Forecast, idle_s: float) -> None:
    """The idle ``lease`` gives up its card now under ``fc``, idle for ``idle_s`` seconds: a
    **no demand** forecast is settled when it next gets the card (:func:`settle`); a
    **demand** one that kept it idle past the rent was wrong."""
    d = lease.demand
    if fc.outlook is Outlook.NONE:
        d.pending = (d.answered_at if d.answered_at is not None else 0.0, fc.rent_s)
    elif fc.outlook is Outlook.DEMAND and idle_s >= fc.rent_s:
        _outcome(d, wrong=True)


def _outcome(d: Demand, wrong: bool) -> None:
    d.error += ERROR_WEIGHT * ((1.0 if wrong else 0.0) - d.error)
    d.forecasts += 1
    d.wrong += int(wrong)
