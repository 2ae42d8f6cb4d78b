"""The scheduler's moves on a lease: park, lend, drain (stop), fall back, ask for a wake or a
return, and what a driver read of its use or a freed share leads to.

Each function changes the :class:`~.state.State` for one lease, every share move through
:meth:`~.ledger.Ledger.move`, and returns the effects to carry out.

Source: seed 002 rules 1 (only the driver confirms memory moved), 2 (a lender's return) and 4
(a park or lend that fails falls back to a drain). Pure: no I/O, no clock.
"""

from __future__ import annotations

from .admission import Waiter, WaitKind
from .effects import Effect, Ended, Instruct, Note
from .ledger import RESIDUAL_SLACK_BYTES as SLACK
from .ledger import counted_bytes
from .model import LIVE_STATES, Bound, Lease, Op, ParkMechanism, Share, ShareState
from .state import State, card_name, drop, step_done
from .units import format_size

S = ShareState

__all__ = ["ending_fields", "begin_park", "begin_lend", "stop", "fallback", "want_resume",
           "want_return", "freed", "after_use"]


def ending_fields(sh: Share) -> dict:
    """Field changes for a share that starts to end (draining, or released by an exit): it keeps
    counting what it holds on the card. A parked share holds only its residual; a lent share
    keeps N out on loan (its borrower counts N); a lend still in flight is called off."""
    if sh.state is S.PARKED:
        return {"reserved_bytes": sh.residual_bytes}
    if sh.state is S.LENT:
        return {}
    if sh.state is S.DRAINING:
        return {}
    return {"lent_bytes": 0}


def begin_park(st: State, lease: Lease, now: float, reason: str,
               quiet_s: float | None = None, fence_at: float | None = None) -> list[Effect]:
    """Park: the front first waits up to ``quiet_s`` for the requests in flight (issue 12
    case 4), so the release grace counts from after that wait; ``fence_at`` (broker's clock):
    meanwhile it forwards the held requests older than that (issue 34, the fence)."""
    seq = st.next_seq()
    fx: list[Effect] = [Instruct(lease.id, Op.PARK, tuple(lease.shares), seq, reason=reason,
                                 quiet_s=quiet_s, fence_age_s=_age(fence_at, now),
                                 made_at=now)]
    for pci, sh in lease.shares.items():
        st.ledger.move(lease.id, pci, S.PARKING, now, parked_bytes=counted_bytes(sh))
        st.deadlines[(lease.id, pci, Op.PARK)] = now + (quiet_s or 0.0) \
            + st.policy.release_grace_s
    # Its cost is measured only when nothing delays the mechanism (rent or buy, issue 24).
    lease.parking_since = now if lease.idle() and not quiet_s else None
    if lease.caps.park is ParkMechanism.CHECKPOINT:
        st.counters.checkpoints += 1
    else:
        st.counters.parks += 1
    fx.append(Note(lease.id, "park", f"{lease.engine} parks by {lease.caps.park} ({reason})"))
    return fx


def begin_lend(st: State, lease: Lease, pci: str, n: int, now: float, reason: str,
               quiet_s: float | None = None) -> list[Effect]:
    """Lend ``n`` bytes of ``lease``'s share on ``pci`` (seed 002 "lend(N)")."""
    st.ledger.move(lease.id, pci, S.LENDING, now, lent_bytes=n)
    st.deadlines[(lease.id, pci, Op.LEND)] = now + (quiet_s or 0.0) + st.policy.release_grace_s
    st.counters.lends += 1
    return [Instruct(lease.id, Op.LEND, (pci,), st.next_seq(), {pci: n}, reason=reason,
                     quiet_s=quiet_s),
            Note(lease.id, "lend", f"{lease.engine} lends {format_size(n)} on "
                 f"{card_name(st, pci)} ({reason})", {"card": pci, "bytes": n})]


def _age(at: float | None, now: float) -> float | None:
    """A time on the broker's clock as an age at ``now`` (seconds): what crosses to a run."""
    return None if at is None else max(0.0, now - at)


def stop(st: State, lease: Lease, now: float, reason: str,
         quiet_s: float | None = None, move_to: str | None = None,
         fence_at: float | None = None) -> list[Effect]:
    """Drain: every live share -> draining, and tell the run to stop its engine, after its
    requests in flight end if ``quiet_s`` allows (issue 12 case 4), and the held ones older
    than ``fence_at`` (broker's clock; issue 34, the fence). ``move_to``: the drain is
    a move (issue 35): the run keeps its front holding requests and asks for a card again at
    once; it is counted as a move, not a drain."""
    fx: list[Effect] = []
    moved = False
    for pci, sh in lease.shares.items():
        if sh.state in LIVE_STATES and sh.state is not S.DRAINING:
            st.ledger.move(lease.id, pci, S.DRAINING, now, **ending_fields(sh))
            for op in (Op.PARK, Op.LEND, Op.WAKE, Op.RETURN):
                st.deadlines.pop((lease.id, pci, op), None)
            # The freed-watch starts when the process is gone (exited), not before.
            st.deadlines[(lease.id, pci, Op.DRAIN)] = now + st.policy.release_grace_s
            moved = True
    if moved:
        st.queue.remove(lease.id)
        st.wake_wanted.discard(lease.id)
        if move_to is None:
            st.counters.drains += 1
        else:
            st.counters.moves += 1
        fx.insert(0, Instruct(lease.id, Op.DRAIN, tuple(lease.shares), st.next_seq(),
                              reason=reason, quiet_s=quiet_s, move_to=move_to,
                              fence_age_s=_age(fence_at, now), made_at=now))
        if move_to is None:
            fx.append(Note(lease.id, "drain", f"{lease.engine} drains ({reason})"))
        else:
            src = ", ".join(card_name(st, p) for p in lease.shares)
            fx.append(Note(lease.id, "move", f"{lease.engine} moves {src}→"
                           f"{card_name(st, move_to)} ({reason})",
                           {"from": list(lease.shares), "to": move_to}))
    return fx


def fallback(st: State, lease: Lease, now: float, why: str) -> list[Effect]:
    """Rule 4: a park or lend that did not free the memory, or a wake or return that did
    not answer, falls back to a drain. A room that counted on the step is now made by a
    drain, and its grant says so. A park or lend of a lease Berth cannot drain (an in-process
    host) that freed nothing is not followed by a drain: :func:`_keeps`."""
    if not lease.caps.drain and lease.states() <= {S.PARKING, S.LENDING, S.ACTIVE}:
        return _keeps(st, lease, now, why)
    st.counters.fallbacks_to_drain += 1
    for room in st.rooms.values():
        if lease.id in room.pending:
            room.fell_back.add(lease.id)
    fx: list[Effect] = [Note(lease.id, "fallback", f"{lease.engine}: {why}; falling back "
                                                   f"to drain")]
    return fx + stop(st, lease, now, f"fallback: {why}")


def _keeps(st: State, lease: Lease, now: float, why: str) -> list[Effect]:
    """A lease Berth never stops whose park (or lend) freed nothing keeps its card: its shares
    are active again, the host opens again (a wake), and the rooms that counted on it are
    dropped, so their waiters are told at once that nothing can free it (issue 24)."""
    lease.frees_nothing = f"its park freed nothing ({why})"
    lease.parking_since = None
    for pci, sh in lease.shares.items():
        if sh.state in (S.PARKING, S.LENDING):
            st.ledger.move(lease.id, pci, S.ACTIVE, now, parked_bytes=0, lent_bytes=0)
        for op in (Op.PARK, Op.LEND):
            st.deadlines.pop((lease.id, pci, op), None)
    st.wake_wanted.discard(lease.id)
    for wid, room in list(st.rooms.items()):
        if lease.id in room.pending:
            del st.rooms[wid]
            st.ledger.earmark(wid, {})
    return [Instruct(lease.id, Op.WAKE, tuple(lease.shares), st.next_seq(),
                     reason="its park freed nothing: it keeps its card"),
            Note(lease.id, "keep", f"{lease.engine}: {lease.frees_nothing}; Berth never stops "
                 f"an in-process host: it keeps its card")]


def want_resume(st: State, lease: Lease, now: float) -> list[Effect]:
    """Queue the wake of a parked lease (it resumes once room is confirmed, rule 2)."""
    if lease.id in st.queue:
        return []
    st.queue.push(Waiter(lease.id, WaitKind.RESUME, lease.priority, now, {}))
    return [Note(lease.id, "wake", f"{lease.engine}: wake asked; waiting for room")]


def want_return(st: State, lease: Lease, now: float) -> list[Effect]:
    """Queue the return of a lend nobody borrows any more."""
    if lease.id in st.queue or not any(
            sh.state is S.LENT and sh.lent_to is None for sh in lease.shares.values()):
        return []
    st.queue.push(Waiter(lease.id, WaitKind.RETURN, lease.priority, now, {}))
    return [Note(lease.id, "return", f"{lease.engine}: its lend is no longer used; "
                                     f"growing back once the driver confirms")]


def freed(st: State, lease: Lease, pci: str, now: float) -> list[Effect]:
    """A driver read confirmed the share on ``pci`` free (rule 1): the lease ends once every
    share is, and a lender whose borrower this was grows back (rule 2). Memory the driver
    does not show free yet (its PID left the driver's list first, as real drivers do) is kept
    on the card as a release under way (:attr:`~.model.Card.freeing`; issue 24)."""
    n = counted_bytes(lease.shares[pci])
    sh = st.ledger.move(lease.id, pci, S.FREED, now)
    if n > 0 and st.ledger.unexplained(pci) >= n // 2:
        st.ledger.cards[pci].freeing[lease.engine] = (n, now)
    st.deadlines.pop((lease.id, pci, Op.DRAIN), None)
    fx: list[Effect] = []
    # The freed entry first: the lender's return follows from it (rule 2), and the
    # timeline must show them in that order.
    if lease.is_over():
        step_done(st, lease.id)
        drop(st, lease.id)
        fx.append(Ended(lease.id, "freed"))
        fx.append(Note(lease.id, "freed", f"{lease.engine}: memory confirmed free"))
    if sh.borrowed_from:
        lender = st.ledger.leases.get(sh.borrowed_from)
        if lender is not None and pci in lender.shares \
                and lender.shares[pci].lent_to == lease.id:
            st.ledger.update(lender.id, pci, lent_to=None)
            fx += want_return(st, lender, now)
    return fx


def after_use(st: State, lease: Lease, sh: Share, now: float) -> list[Effect]:
    """What a driver read of the holder's use leads to: a parked share that loaded again is
    active again (``lease.unparked``); an active one over its lease is said once
    (``over_lease``); a growth-bound one past its reservation asks for more (seed 000)."""
    used = sh.used_bytes
    if used is None:
        return []
    if sh.state is S.PARKED and used > sh.residual_bytes + max(SLACK, sh.residual_bytes // 20):
        return _unparked(st, lease, sh, used, now)
    fx = _over_lease(st, lease, sh, used)
    if sh.state is S.ACTIVE and lease.bound is Bound.GROWTH and used > sh.reserved_bytes \
            and lease.id not in st.queue:
        want = min(sh.size_bytes, used + lease.growth_allowance_bytes) - sh.reserved_bytes
        if want > 0:
            st.queue.push(Waiter(lease.id, WaitKind.EXTEND, lease.priority, now,
                                 {sh.card: want}))
    return fx


def _unparked(st: State, lease: Lease, sh: Share, used: int, now: float) -> list[Effect]:
    # "A share that loads more than it may while asleep goes back to active and is reported
    # (lease.unparked), so the next drain parks it again."
    st.ledger.move(lease.id, sh.card, S.ACTIVE, now)
    st.queue.remove(lease.id)
    st.counters.unparked += 1
    return [Note(lease.id, "lease.unparked", f"{lease.engine} loaded {format_size(used)} on "
                 f"{card_name(st, sh.card)} while parked; counted active again",
                 {"card": sh.card, "used_bytes": used}),
            Instruct(lease.id, Op.WAKE, (sh.card,), st.next_seq(), reason="unparked")]


def _over_lease(st: State, lease: Lease, sh: Share, used: int) -> list[Effect]:
    key = (lease.id, sh.card)
    if not (sh.state is S.ACTIVE and used > sh.reserved_bytes + SLACK):
        st.over.discard(key)
        return []
    if key in st.over:
        return []
    st.over.add(key)
    return [Note(lease.id, "over_lease", f"{lease.engine} uses {format_size(used)} on "
                 f"{card_name(st, sh.card)}, more than its lease's "
                 f"{format_size(sh.reserved_bytes)}; counted at its use, not its lease",
                 {"card": sh.card, "used_bytes": used, "reserved_bytes": sh.reserved_bytes})]
