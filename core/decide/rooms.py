"""Admitting and making room: the admission pass (which waiter is granted), and the ladder's
plan carried out step by step until the driver confirms each victim's memory moved.

Source: seed 000 (admission), seed 002 "Making room". Pure: no I/O, no clock.
"""

from __future__ import annotations

from . import demand
from .actions import begin_lend, begin_park, stop, want_return
from .admission import Waiter, WaitKind, admission_pass
from .causes import jobs_words
from .effects import Effect, Ended, Granted, Instruct, Note, ReadCards, Rejected
from .ladder import Action, NoPlan, Plan, Rung, Step, plan
from .model import Lease, Op, ParkMechanism, ShareState
from .moves import plan_moves
from .placement import _cost_s, choose
from .state import Moving, Room, State, awaited, card_name, drop
from .turns import idle_for, idle_forecast, turn_end
from .units import format_size

S = ShareState

__all__ = ["admit", "make_room", "cancel_room", "withdraw"]


def admit(st: State, now: float) -> list[Effect]:
    """One admission pass (:func:`~.admission.admission_pass`) over the queue: grants, rooms
    started for waiters that do not fit, waiters that never can taken out, and a
    :class:`ReadCards` for cards whose read is older than this step (rule 1)."""
    fx: list[Effect] = []
    st.finished.clear()

    def start_room(w: Waiter) -> bool:
        fx.extend(make_room(st, w, now))
        return w.lease_id in st.rooms

    def in_flight(w: Waiter) -> bool:
        room = st.rooms.get(w.lease_id)
        return room is not None and bool(room.pending)

    def fresh(pci: str) -> bool:
        # Rule 1: a grant is decided on a driver read taken in this very step.
        at = st.ledger.cards[pci].read_at
        return at is not None and at >= now

    def place(w: Waiter, room_of, blocked: set[str]) -> None:
        _place(st, w, now, room_of, blocked)

    res = admission_pass(st.ledger, st.queue, st.policy, now, start_room, in_flight,
                         fresh if st.read_before_grant else None, place)
    if res.stale:
        fx.append(ReadCards("", tuple(sorted(res.stale))))
    st.behind = res.behind
    st.counters.admissions_rejected_with_free += res.rejected_with_free
    for w, reason in res.never:
        fx += _never(st, w, reason, now)
    for w in res.granted:
        fx += _granted(st, w, now)
    return fx


def _place(st: State, w: Waiter, now: float, room_of, blocked: set[str]) -> None:
    """Put a waiter's movable shares on the best cards now (:func:`.placement.choose`;
    issue 25), unless room is being made for it (its cards are fixed from then on). A wake
    is placed so too when its checkpoint restores onto another card (issue 35:
    :attr:`~.model.Capabilities.restore_across`, every share of free placement, nothing left
    on its cards)."""
    lease = st.ledger.leases[w.lease_id]
    if not lease.movable or w.lease_id in st.rooms:
        return
    if w.kind is WaitKind.RESUME:
        if not (lease.caps.restore_across and lease.movable == set(lease.shares)
                and st.ledger.parked_away(lease) and not lease.caps.pinned):
            return
    elif not lease.is_waiting():
        return
    busy = frozenset(p for r in st.rooms.values() if r.pending for p in r.cards)
    ch = choose(st.ledger, w, st.policy, now, st.swaps, busy, room_of, blocked)
    if ch is None:
        return
    st.ledger.rehome(w.lease_id, ch.moves)
    if w.kind is not WaitKind.RESUME:
        st.placed[w.lease_id] = ch.why
    elif any(a != b for a, b in ch.moves.items()):
        st.placed[w.lease_id] = ch.why.replace("placed on", "restored onto", 1)


def _never(st: State, w: Waiter, reason: str, now: float) -> list[Effect]:
    """A waiter that can never fit: a new lease is rejected; a wake, return or extension is
    only said (its lease keeps what it holds)."""
    st.counters.rejected_never += 1
    lease = st.ledger.leases[w.lease_id]
    fx = cancel_room(st, w.lease_id, now)
    if w.kind is not WaitKind.GRANT:
        return fx + [Note(w.lease_id, "never", f"{lease.engine}: {reason}")]
    for pci in lease.shares:
        st.ledger.move(w.lease_id, pci, S.FREED, now)
    drop(st, w.lease_id)
    return fx + [Rejected(w.lease_id, reason), Ended(w.lease_id, "rejected")]


def _granted(st: State, w: Waiter, now: float) -> list[Effect]:
    """Effects of one admission, by the waiter's kind: a grant, a wake or a return once room
    is confirmed (rule 2), or an extension."""
    lease = st.ledger.leases[w.lease_id]
    if w.kind in (WaitKind.GRANT, WaitKind.RESUME):
        demand.settle(lease, st.ledger.leases.values())      # issue 34
    room = st.rooms.pop(w.lease_id, None) or _take_over(st, w)
    st.noplan_said.pop(w.lease_id, None)
    rung = room.plan.rung.value if room else Rung.FIT.value
    if room is not None and room.fell_back:
        rung = Rung.DRAIN.value       # the room came from a drain after all (rule 4)
    lent_fx: list[Effect] = []
    if room is not None:
        for step in room.plan.steps:
            # The juggle guard counts only swaps where both sides had demand (issue 16).
            if step.lease_id in room.contested:
                st.swaps.record(lease.engine, step.engine, now)
            if step.action is Action.LEND:
                lent_fx += _link_lend(st, step, lease, now)
    need = ", ".join(f"{card_name(st, p)} {format_size(b)}" for p, b in w.need.items())
    if w.kind is WaitKind.GRANT:
        st.counters.grants += 1
        if rung == Rung.FIT.value and any(st.ledger.parked_on(p) for p in w.need):
            rung = Rung.BESIDE_RESIDUAL.value
        placed = st.placed.pop(w.lease_id, None)
        return [Granted(w.lease_id, dict(w.need), rung),
                Note(w.lease_id, "grant", f"{lease.engine} granted {need} ({rung})"
                     + (f"; {placed}" if placed else ""),
                     {"rung": rung, "waited_s": now - w.since,
                      **({"placed": placed} if placed else {})})] + lent_fx
    if w.kind is WaitKind.RESUME:
        for pci in w.need:
            st.deadlines[(w.lease_id, pci, Op.WAKE)] = now + st.policy.wake_limit_s
        placed = st.placed.pop(w.lease_id, None)
        return [Instruct(w.lease_id, Op.WAKE, tuple(w.need), st.next_seq(),
                         reason="room confirmed"),
                Note(w.lease_id, "resume", f"{lease.engine} resuming ({rung})"
                     + (f"; {placed}" if placed else ""),
                     {"rung": rung, "waited_s": now - w.since,
                      **({"placed": placed} if placed else {})})] + lent_fx
    if w.kind is WaitKind.RETURN:
        for pci in w.need:
            st.deadlines[(w.lease_id, pci, Op.RETURN)] = now + st.policy.wake_limit_s
        return [Instruct(w.lease_id, Op.RETURN, tuple(w.need), st.next_seq(), dict(w.need),
                         reason="the borrower's memory is confirmed gone"),
                Note(w.lease_id, "returning", f"{lease.engine} grows back "
                     + ", ".join(f"{card_name(st, p)}:{b}" for p, b in w.need.items()),
                     {"cards": dict(w.need), "waited_s": now - w.since})] + lent_fx
    st.counters.extensions += 1
    return [Note(w.lease_id, "extend", f"{lease.engine} reservation extended by {need}")] \
        + lent_fx


def _take_over(st: State, w: Waiter) -> Room | None:
    """A waiter granted on its cards before the one whose room was made there (it ranks
    before it: issue 24) takes that finished room: its earmark goes, and the other plans
    again if it still does not fit."""
    for rooms in (st.rooms, st.finished):
        for rid, room in list(rooms.items()):
            if rid != w.lease_id and not room.pending and room.cards & set(w.need):
                del rooms[rid]
                st.ledger.earmark(rid, {})
                return room
    return None


def _link_lend(st: State, step: Step, borrower: Lease, now: float) -> list[Effect]:
    """Link a finished lend to the lease granted on it. A lend is exactly its borrower's need;
    a room taken over by a waiter of another size (:func:`_take_over`) leaves the lend to
    nobody, so the lender asks its bytes back (rule 2) instead of a borrower whose release
    would give back the wrong amount."""
    lender = st.ledger.leases.get(step.lease_id)
    if lender is None:
        return []
    pci = step.cards[0]
    lsh = lender.shares[pci]
    bsh = borrower.shares.get(pci)
    if lsh.state is not S.LENT or lsh.lent_to is not None or bsh is None \
            or borrower.is_waiting() is not False:
        return []
    if bsh.reserved_bytes != lsh.lent_bytes:
        return want_return(st, lender, now)
    lsh.lent_to = borrower.id
    bsh.borrowed_from = lender.id
    return []


def make_room(st: State, w: Waiter, now: float) -> list[Effect]:
    """Plan room for waiter ``w`` (:func:`~.ladder.plan`) and begin each step; a waiter with no
    plan is told why once per reason."""
    if w.lease_id in st.rooms:
        # A finished room that still did not make the waiter fit: plan again.
        if st.rooms[w.lease_id].pending:
            return []
        st.finished[w.lease_id] = st.rooms.pop(w.lease_id)
        st.ledger.earmark(w.lease_id, {})
    busy = frozenset(p for r in st.rooms.values() if r.pending for p in r.cards)
    p = plan(st.ledger, w, st.policy, now, st.swaps, busy, fence=True)
    lease = st.ledger.leases[w.lease_id]
    p = _move_instead(st, w, p, busy) or p
    st.recheck.pop(w.lease_id, None)
    if isinstance(p, NoPlan):
        due = _turns_end(st, lease, now)
        if due is not None and not p.lasting:
            st.recheck[w.lease_id] = due
        if st.noplan_said.get(w.lease_id) != (p.reason, p.lasting):
            st.noplan_said[w.lease_id] = (p.reason, p.lasting)
            return [Note(w.lease_id, "wait", f"{lease.engine} waits: {p.reason}",
                         {"lasting": p.lasting})]
        return []
    if not p.steps:
        return []
    st.noplan_said.pop(w.lease_id, None)
    contested = frozenset(step.lease_id for step in p.steps
                          if not st.ledger.leases[step.lease_id].idle())
    st.rooms[w.lease_id] = Room(p, frozenset(w.need), {step.lease_id for step in p.steps}, now,
                                contested)
    st.ledger.earmark(w.lease_id, w.need)
    return _begin_steps(st, p, lease, now)


def _move_instead(st: State, w: Waiter, p: Plan | NoPlan, busy: frozenset[str]) -> Plan | None:
    """The move rung (issue 35): moves that let a new lease fit with nothing parked or drained
    (:func:`.moves.plan_moves`), when the ladder has no plan or only a park or a drain that
    costs as much or more (each by its measured cost, :func:`.placement._cost_s`). The waiter
    goes to the card the moves empty (:meth:`~.ledger.Ledger.rehome`). ``None``: no move."""
    if w.kind is not WaitKind.GRANT or not st.ledger.leases[w.lease_id].makes_room or (
            isinstance(p, Plan) and (
            not p.steps or any(s.action is Action.LEND for s in p.steps))):
        return None
    lease = st.ledger.leases[w.lease_id]
    needs = set(w.need.values())
    movable = set(w.need) <= lease.movable
    if not lease.is_waiting() or len(needs) != 1 or len(w.need) > 1:
        # A waiter over several cards is not moved for yet: on bench/policy's four-card trace
        # its moves helped on 4 seeds of 11 and hurt on 3 (issue 35's note).
        return None
    need = needs.pop()
    cards = [c for c in st.ledger.cards if c not in busy] if movable else list(w.need)
    protected = frozenset(le.id for le in st.ledger.leases.values()
                          if le.held or le.priority > w.priority)
    mv = plan_moves(st.ledger, w.lease_id, need, cards, 0.0, protected=protected,
                    count=len(w.need))
    if mv is None or not mv.moves:
        return None
    if isinstance(p, Plan) and mv.cost_s > sum(
            _cost_s(st.ledger.leases[s.lease_id], s.action) for s in p.steps):
        return None
    old, new = set(w.need), set(mv.cards)
    if old != new:
        st.ledger.rehome(w.lease_id, dict(zip(sorted(old - new), sorted(new - old),
                                              strict=True)))
        w.need = {c: need for c in mv.cards}
    steps = tuple(Step(m.lease_id, m.engine, Action.MOVE, (m.src,), {m.src: m.frees_bytes},
                       why=f"to {card_name(st, m.dst)}", move_to=m.dst) for m in mv.moves)
    return Plan(w.lease_id, Rung.MOVE, steps)


def _turns_end(st: State, waiter: Lease, now: float) -> float | None:
    """The earliest time a turn in the waiter's way ends (:func:`~.turns.turn_end` of each
    active holder of equal or higher priority on its cards), so the next pass comes then and
    not at the next driver read; ``None``: none ends."""
    ends = []
    w = st.queue.get(waiter.id)
    for pci in waiter.shares:
        for holder, _sh in st.ledger.active_on(pci):
            if holder.id != waiter.id and holder.priority >= waiter.priority:
                end = turn_end(holder, st.policy, now, waiter, _since(waiter, w))
                if end is not None:
                    ends.append(end)
    return min(ends, default=None)


def _since(waiter: Lease, w) -> float | None:
    """When the waiter's oldest request arrived, as the ladder counts it (its queue entry, or
    its front's oldest request if older)."""
    if w is None:
        return None
    return w.since if waiter.oldest_job_at is None else min(w.since, waiter.oldest_job_at)


def _begin_steps(st: State, p: Plan, lease: Lease, now: float) -> list[Effect]:
    """The plan's note, then each victim's park, lend or drain begun."""
    fx: list[Effect] = [Note(lease.id, "plan", f"making room for {lease.engine} by "
                             f"{p.rung}: " + ", ".join(
                                 f"{step.action} {step.engine}"
                                 + (f" ({step.why})" if step.why else "") for step in p.steps),
                             {"rung": p.rung.value,
                              "steps": [(step.action.value, step.engine) for step in p.steps]})]
    for step in p.steps:
        victim = st.ledger.leases[step.lease_id]
        if victim.idle() and victim.priority == lease.priority:
            # The forecast its turn yielded under is settled later (issue 34).
            demand.yielded(victim, idle_forecast(victim, lease, st.policy, now=now),
                           idle_for(victim, st.policy, now))
        reason = f"room for {lease.engine}"
        if step.jobs:
            reason += f", after its {jobs_words(step.jobs)}" if step.quiet_s else \
                f", preempting its {jobs_words(step.jobs)}"
        # A park or lend waits for quiet only when jobs run now (its release grace counts
        # after that wait); a drain always lets a job that slipped in finish.
        quiet = step.quiet_s if step.jobs else None
        if step.action is Action.LEND:
            fx += begin_lend(st, victim, step.cards[0], step.lend_bytes, now, reason, quiet)
        elif step.action is Action.PARK:
            fx += begin_park(st, victim, now, reason, quiet, step.fence_at if quiet else None)
        elif step.action is Action.MOVE:
            fx += _move(st, victim, step, now, reason)
        else:
            # Why a drain and not a park ("no park: ... the RAM budget has ... left") reaches
            # the run and the board's drained row, not only berthd's log.
            why = f"{reason} ({step.why})" if step.why else reason
            fx += stop(st, victim, now, why, step.quiet_s, fence_at=step.fence_at)
    return fx


def _move(st: State, victim: Lease, step: Step, now: float, reason: str) -> list[Effect]:
    """Begin a move (issue 35); its requests in flight finish first (max_job). A checkpoint
    that restores onto another card moves by a park whose wake follows at once, placed where
    the engine fits best (:func:`_place`): the same lease and process. Otherwise the engine
    restarts: a drain whose run asks for a card again at once."""
    quiet = st.policy.max_job_s if victim.in_flight else None
    if not (victim.caps.restore_across and victim.caps.park is ParkMechanism.CHECKPOINT):
        st.moving[victim.id] = Moving(tuple(victim.shares), step.move_to, reason, now,
                                      "restart")
        return stop(st, victim, now, f"{reason}; it moves {step.why}", quiet,
                    move_to=step.move_to)
    st.counters.moves += 1
    st.wake_wanted.add(victim.id)
    st.moving[victim.id] = Moving(tuple(victim.shares), step.move_to, reason, now)
    src = ", ".join(card_name(st, p) for p in victim.shares)
    return begin_park(st, victim, now, f"{reason}; it moves {step.why} by checkpoint and "
                      f"restore", quiet) + [
        Note(victim.id, "move", f"{victim.engine} moves {src}→{card_name(st, step.move_to)} "
             f"by checkpoint and restore ({reason})",
             {"from": list(victim.shares), "to": step.move_to, "how": "restore"})]


def cancel_room(st: State, lease_id: str, now: float) -> list[Effect]:
    """The waiter left: drop its room and earmark. Lends already confirmed grow back. A park
    still under way for it is called off at its next step that can be undone (a checkpoint
    that has not begun does not begin; issue 24), unless another waiter wants those cards:
    the room then goes to the best waiter when it appears."""
    room = st.rooms.pop(lease_id, None)
    st.ledger.earmark(lease_id, {})
    st.noplan_said.pop(lease_id, None)
    fx: list[Effect] = []
    if room is None:
        return fx
    wanted = any(w.lease_id != lease_id and room.cards & set(st.ledger.leases[w.lease_id].shares)
                 for w in st.queue if w.lease_id in st.ledger.leases)
    for step in room.plan.steps:
        victim = st.ledger.leases.get(step.lease_id)
        if victim is None:
            continue
        if step.action is Action.LEND:
            fx += want_return(st, victim, now)
        elif step.action is Action.PARK and not wanted and step.lease_id in room.pending \
                and victim.states() == {S.PARKING} and not awaited(st, victim.id):
            fx += _call_off(st, victim, now)
    return fx


def _call_off(st: State, victim: Lease, now: float) -> list[Effect]:
    """Ask the victim's run to call its park off if the mechanism has not begun; its answer
    (``called off``, or the park's own report) settles the share (:func:`.reports.report`)."""
    return [Instruct(victim.id, Op.WAKE, tuple(victim.shares), st.next_seq(),
                     reason="the waiter it parked for has gone", call_off=True),
            Note(victim.id, "park.calloff", f"{victim.engine}: the waiter its park was for has "
                 f"gone; the park is called off unless its mechanism has begun")]


def withdraw(st: State, lease_id: str, now: float, reason: str) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.withdraw`. Raises ``KeyError``/``ValueError``."""
    lease = st.ledger.leases[lease_id]
    if not lease.is_waiting():
        raise ValueError(f"lease {lease_id}: not waiting (it is "
                         f"{', '.join(sorted(s.value for s in lease.states()))}); "
                         f"release it instead")
    fx = cancel_room(st, lease_id, now)
    st.queue.remove(lease_id)
    for pci in lease.shares:
        st.ledger.move(lease_id, pci, S.FREED, now)
    drop(st, lease_id)
    fx.append(Ended(lease_id, reason))
    return fx + admit(st, now)


def unextend(st: State, lease_id: str, now: float, reason: str) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.unextend`. Raises ``KeyError``."""
    lease = st.ledger.leases[lease_id]
    w = st.queue.get(lease_id)
    if w is None or w.kind is not WaitKind.EXTEND:
        return []
    st.queue.remove(lease_id)
    fx = cancel_room(st, lease_id, now)
    fx.append(Note(lease_id, "extend.off", f"{lease.engine}: its request for more room "
                                            f"ended ({reason})"))
    return fx + admit(st, now)
