"""What the driver and the runs tell the scheduler: a driver read (``observe``), a driver
confirmation that memory left or is free (``confirmed``), a run's report on an instruction
(``report``) and its front's jobs (``jobs``).

Source: seed 002 rule 1 (only a driver read says memory moved: a run's word starts a
confirmation, never replaces it) and rule 4 (a failure falls back to a drain). Pure: no I/O,
no clock.
"""

from __future__ import annotations

from . import demand
from .actions import after_use, fallback, freed, want_resume, want_return
from .effects import CardRead, Effect, Note, Until, Watch
from .model import OPS, Lease, Op, ShareState
from .restarts import exited
from .rooms import admit
from .state import State, awaited, bytes_on, card_name, residual_limit, step_done
from .turns import idle_forecast, turn_start
from .units import format_duration, format_size

S = ShareState

__all__ = ["observe", "confirmed", "report", "jobs", "asked", "contender"]


def observe(st: State, reads: dict[str, CardRead], now: float) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.observe`."""
    fx: list[Effect] = []
    led = st.ledger
    for pci, r in reads.items():
        card = led.cards.get(pci)
        if card is None:
            continue
        card.free_bytes, card.read_at = r.free_bytes, now
        card.stowaway_bytes = r.stowaway_bytes
        card.stowaways = dict(r.stowaways)
        card.stowaway_who = dict(r.stowaway_who)
        if r.total_bytes is not None:
            card.total_bytes = r.total_bytes
        for lid, used in r.used.items():
            lease = led.leases.get(lid)
            if lease is None or pci not in lease.shares:
                continue
            sh = led.update(lid, pci, used_bytes=used,
                            peak_bytes=max(lease.shares[pci].peak_bytes, used or 0))
            # Growth is what a serving engine adds past its reservation (admission counted the
            # rest); its load or restore is not growth.
            serving = sh.state is S.ACTIVE and lease.ready_at is not None and \
                now - max(sh.since, lease.ready_at) > st.policy.read_interval_s
            if used is not None and serving:
                st.growth.record(lid, pci, max(0, used - sh.reserved_bytes), now)
            else:
                st.growth.reset(lid, pci)
            fx += after_use(st, lease, sh, now)
        _settle_freeing(st, pci, now)
    return fx + admit(st, now)


def _settle_freeing(st: State, pci: str, now: float) -> None:
    """Memory left behind by a process that is gone stops being "under way" once the driver
    shows it free, or after the release grace (it is then whatever holds it: a stowaway's, or
    the card's own)."""
    card = st.ledger.cards[pci]
    if not card.freeing:
        return
    if st.ledger.unexplained(pci) < sum(b for b, _ in card.freeing.values()) // 4:
        card.freeing.clear()
        return
    for engine, (_b, since) in list(card.freeing.items()):
        if now - since >= st.policy.release_grace_s:
            del card.freeing[engine]


def confirmed(st: State, lease_id: str, pci: str, what: str, now: float,
              use_bytes: int | None) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.confirmed`."""
    lease = st.ledger.leases.get(lease_id)
    if lease is None or pci not in lease.shares:
        return []
    sh = lease.shares[pci]
    fx: list[Effect] = []
    if what == Until.PARKED and sh.state is S.PARKING:
        st.ledger.move(lease_id, pci, S.PARKED, now, residual_bytes=use_bytes or 0,
                       used_bytes=use_bytes)
        st.deadlines.pop((lease_id, pci, Op.PARK), None)
        if all(s.state is S.PARKED for s in lease.shares.values()):
            if lease.parking_since is not None:
                lease.park_cost_s, lease.parking_since = now - lease.parking_since, None
            fx.append(Note(lease_id, "parked", f"{lease.engine} parked; residual "
                           f"{bytes_on(st, lease, 'residual_bytes')}"))
            step_done(st, lease_id)
            if lease_id in st.wake_wanted:
                st.wake_wanted.discard(lease_id)
                fx += want_resume(st, lease, now)
    elif what == Until.LENT and sh.state is S.LENDING:
        st.ledger.move(lease_id, pci, S.LENT, now, used_bytes=use_bytes)
        st.deadlines.pop((lease_id, pci, Op.LEND), None)
        fx.append(Note(lease_id, "lent", f"{lease.engine} lent {format_size(sh.lent_bytes)} on "
                       f"{card_name(st, pci)}", {"card": pci, "bytes": sh.lent_bytes}))
        if not step_done(st, lease_id):
            fx += want_return(st, lease, now)     # nobody is waiting for it any more
    elif what == Until.FREED and sh.state in (S.DRAINING, S.RELEASED):
        if sh.state is S.DRAINING:
            st.ledger.move(lease_id, pci, S.RELEASED, now)
        fx += freed(st, lease, pci, now)
    else:
        return []
    return fx + admit(st, now)


def report(st: State, lease_id: str, op: str, ok: bool, now: float,
           detail: str) -> list[Effect]:
    """A run's word on an instruction, numbered as in the code:

    1. wake or return done: each resuming (returning) share is active again; counted once;
    2. wake or return failed: fall back to a drain at once (rule 4);
    3. park failed "busy" (the front could not go quiet; the engine was never touched) and no
       room waits for it, or "called off" (its waiter left before the mechanism began, issue
       24): the park is called off, its shares active again;
    4. park or lend failed otherwise: fall back to a drain at once (rule 4);
    5. park or lend done: the run's word is not proof (rule 1), it is the event a driver read
       must follow: start the confirmation (:class:`Watch`) within the release grace;
    6. drain: the engine process has exited (:func:`~.restarts.exited`, final).

    A report that no longer matches the share's state changes nothing; an admission pass
    follows. Raises ``ValueError`` for an ``op`` that is not an instruction."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")
    lease = st.ledger.leases.get(lease_id)
    if lease is None:
        return []
    if op == Op.DRAIN:                                                           # (6)
        return exited(st, lease_id, now, final=True)
    if op in (Op.WAKE, Op.RETURN):
        fx = _restored(st, lease, op, ok, now, detail)
    else:
        fx = _released(st, lease, op, ok, now, detail)
    return fx + admit(st, now)


def _restored(st: State, lease: Lease, op: str, ok: bool, now: float,
              detail: str) -> list[Effect]:
    """Steps (1) and (2) of :func:`report`."""
    src = S.RESUMING if op == Op.WAKE else S.RETURNING
    was = src in lease.states()
    for pci, sh in lease.shares.items():
        if sh.state is not src:
            continue
        st.deadlines.pop((lease.id, pci, op), None)
        if ok:
            if op == Op.WAKE:
                lease.switch_cost_s = now - sh.since
            st.ledger.move(lease.id, pci, S.ACTIVE, now, lent_bytes=0)
    if not was:
        return []
    moved = st.moving.pop(lease.id, None) if op == Op.WAKE else None
    if not ok:                                                                   # (2)
        return fallback(st, lease, now, f"{op} failed: {detail or 'no reason given'}")
    lease.last_used_at = now                                                     # (1)
    if op == Op.WAKE:
        st.counters.wakes += 1
        if lease.in_flight:
            lease.last_job_at = now     # the requests it woke for are served now
    else:
        st.counters.returns += 1
    where = "" if moved is None else " on " + ", ".join(card_name(st, p) for p in lease.shares) + \
        f", its move from {', '.join(card_name(st, p) for p in moved.src)} done in " \
        f"{format_duration(now - moved.since)}"
    return [Note(lease.id, op, f"{lease.engine} {'woke' if op == Op.WAKE else 'grew back'}"
                               f"{where}")]


def _released(st: State, lease: Lease, op: str, ok: bool, now: float,
              detail: str) -> list[Effect]:
    """Steps (3), (4) and (5) of :func:`report`."""
    src = S.PARKING if op == Op.PARK else S.LENDING
    was = src in lease.states()
    if not ok and was and op == Op.PARK and detail.startswith(("busy", "called off")) \
            and not awaited(st, lease.id):                                       # (3)
        for pci, sh in lease.shares.items():
            if sh.state is S.PARKING:
                st.ledger.move(lease.id, pci, S.ACTIVE, now, parked_bytes=0)
                st.deadlines.pop((lease.id, pci, Op.PARK), None)
        lease.parking_since = None
        st.wake_wanted.discard(lease.id)
        st.moving.pop(lease.id, None)
        return [Note(lease.id, "park.off", f"{lease.engine}: park called off, nothing "
                                           f"waits for the room ({detail})")]
    if not ok:                                                                   # (4)
        st.moving.pop(lease.id, None)
        return fallback(st, lease, now, f"{op} failed: {detail or 'no reason given'}") \
            if was else []
    fx: list[Effect] = []                                                        # (5)
    for pci, sh in lease.shares.items():
        if sh.state is not src:
            continue
        # The deadline covered the front's wait for quiet (up to max_job); the engine is
        # done now, so the driver has the release grace from here.
        due = min(st.deadlines.get((lease.id, pci, op), float("inf")),
                  now + st.policy.release_grace_s)
        st.deadlines[(lease.id, pci, op)] = due
        limit = residual_limit(st, lease, pci) if op == Op.PARK else \
            max(0, sh.reserved_bytes - sh.lent_bytes)
        fx.append(Watch(lease.id, pci, Until.PARKED if op == Op.PARK else Until.LENT, limit,
                        now, max(due, now)))
    return fx


def jobs(st: State, lease_id: str, in_flight: int, now: float, oldest_at: float | None,
         served: int | None, client: str | None = None, answered_client: str | None = None,
         answered_at: float | None = None, held: int | None = None,
         oldest_held_at: float | None = None) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.jobs`."""
    for name, n in (("in_flight", in_flight), ("served", served), ("held", held)):
        if n is not None and n < 0:
            raise ValueError(f"{name}: expected a count >= 0, got {n}")
    lease = st.ledger.leases[lease_id]
    demand.answered(lease, answered_client, answered_at)
    if in_flight and not lease.in_flight:
        # A request came to a front that had none: what the forecast learns from (issue 34).
        _arrival(st, lease, client, oldest_at if oldest_at is not None else now)
    elif in_flight and client is not None:
        lease.demand.asked_client = client      # the oldest request now may be another
    moved = served is not None and served != lease.served and served > 0
    # Every turn's first request is noted, a waiter queued or not: a waiter that asks later
    # reads from the timeline that the hold for it ended (and a drain, that it came after).
    fx = _first_request(st, lease, now) if in_flight or moved else []
    if in_flight and not lease.in_flight:
        lease.busy_since = now
    elif not in_flight:
        lease.busy_since = None
    went_idle = not in_flight and (lease.in_flight or not lease.jobs_reported)
    if in_flight or moved:
        lease.last_job_at = now
    if in_flight:
        lease.idle_since = None
    elif went_idle or moved:
        lease.idle_since = now      # the end of its last request, within one sample
    # Its older requests ended: a waiter that asked before the ones left may go now.
    moved_on = lease.oldest_job_at is not None and (
        oldest_at is None or oldest_at > lease.oldest_job_at)
    # It holds requests now: a waiter's fenced park need not wait for its older ones to end.
    holds = bool(held) and not lease.held_jobs
    lease.held_jobs = min(held or 0, in_flight)
    lease.oldest_held_at = oldest_held_at if lease.held_jobs else None
    lease.in_flight, lease.jobs_reported = in_flight, True
    lease.served = lease.served if served is None else served
    lease.oldest_job_at = oldest_at if in_flight else None
    if not in_flight:
        lease.demand.asked_client = lease.demand.asked_at = lease.demand.asked_moved = None
    lease.last_used_at = now
    return fx + (admit(st, now) if (went_idle or moved_on or moved or holds) and len(st.queue)
                 else [])


def asked(st: State, lease: Lease, client: str | None, at: float) -> None:
    """A front asks for its sleeping engine's wake for a request of ``client`` that arrived at
    ``at``: the forecast of the holders in its way looks at that client at once (the jobs
    report that counts the request may come later)."""
    if lease.in_flight == 0:
        _arrival(st, lease, client, at)


def _arrival(st: State, lease: Lease, client: str | None, at: float) -> None:
    """The first request at an idle front (issue 34): its idle gap, and, for an idle holder
    kept for a waiter, whether the forecast that kept it was right."""
    kept, holds = None, S.ACTIVE in lease.states()
    if lease.idle() and holds:
        waiter = contender(st, lease)
        if waiter is not None:
            kept = idle_forecast(lease, waiter, st.policy, now=at)
    moved = demand.moved_from(st.ledger.leases.values(), lease, client, at)
    demand.arrived(lease, client, at, kept, moved if holds else None, holds, moved)


def contender(st: State, lease: Lease) -> Lease | None:
    """The first waiter of equal priority queued for one of ``lease``'s cards (the one an idle
    holder's turn is judged against, issue 34), if any."""
    for w in st.queue:
        other = st.ledger.leases.get(w.lease_id)
        if other is not None and other.id != lease.id and other.priority == lease.priority \
                and set(w.need or other.shares) & set(lease.shares):
            return other
    return None


def _first_request(st: State, lease: Lease, now: float) -> list[Effect]:
    """A note when this request is the first of the holder's turn: the card it kept for it
    (``first_request_s``, a manager's health poll) is kept no longer (issue 24). Noted with
    no waiter queued too: the timeline then says when each turn's first request came."""
    start, said = turn_start(lease, st.policy)
    if not said or now < start or (lease.last_job_at is not None and lease.last_job_at >= start):
        return []
    return [Note(lease.id, "first_request", f"{lease.engine} has its first request "
                 f"{format_duration(now - start)} after it said it serves; it no longer keeps "
                 f"its card for one")]
