"""The admission pass and making room: which waiter is granted, and the ladder's plan carried
out step by step until the driver confirms each victim's memory moved.

Source: seed 000 (admission), seed 002 "Making room". Pure: no I/O, no clock.
"""

from __future__ import annotations

from .actions import Actions
from .admission import Waiter, WaitKind, admission_pass
from .causes import jobs_words
from .effects import Effect, Ended, Granted, Instruct, Note, ReadCards, Rejected
from .ladder import Action, NoPlan, Rung, Step, plan
from .model import Lease, Op, ShareState
from .state import Room
from .units import format_size

S = ShareState

__all__ = ["Rooms"]


class Rooms(Actions):
    """The admission pass (:meth:`_pass`) and the rooms it makes for waiters."""

    def _pass(self, now: float) -> list[Effect]:
        fx: list[Effect] = []

        def make_room(w: Waiter) -> bool:
            fx.extend(self._make_room(w, now))
            return w.lease_id in self.rooms

        def in_flight(w: Waiter) -> bool:
            room = self.rooms.get(w.lease_id)
            return room is not None and bool(room.pending)

        def fresh(pci: str) -> bool:
            # Rule 1: a grant is decided on a driver read taken in this very step.
            at = self.ledger.cards[pci].read_at
            return at is not None and at >= now

        res = admission_pass(self.ledger, self.queue, self.policy, now, make_room, in_flight,
                             fresh if self.read_before_grant else None)
        if res.stale:
            fx.append(ReadCards("", tuple(sorted(res.stale))))
        self._behind = res.behind
        self.counters.admissions_rejected_with_free += res.rejected_with_free
        for w, reason in res.never:
            self.counters.rejected_never += 1
            lease = self.ledger.leases[w.lease_id]
            fx += self._cancel_room(w.lease_id, now)
            if w.kind is WaitKind.GRANT:
                for pci in lease.shares:
                    self.ledger.move(w.lease_id, pci, S.FREED, now)
                self._drop(w.lease_id)
                fx += [Rejected(w.lease_id, reason), Ended(w.lease_id, "rejected")]
            else:
                fx.append(Note(w.lease_id, "never", f"{lease.engine}: {reason}"))
        for w in res.granted:
            fx += self._granted(w, now)
        return fx

    def _granted(self, w: Waiter, now: float) -> list[Effect]:
        lease = self.ledger.leases[w.lease_id]
        room = self.rooms.pop(w.lease_id, None)
        self._noplan_said.pop(w.lease_id, None)
        rung = room.plan.rung.value if room else Rung.FIT.value
        if room is not None and room.fell_back:
            rung = Rung.DRAIN.value       # the room came from a drain after all (rule 4)
        if room is not None:
            for st in room.plan.steps:
                # The juggle guard counts only swaps where both sides had demand (issue 16).
                if st.lease_id in room.contested:
                    self.swaps.record(lease.engine, st.engine, now)
                if st.action is Action.LEND:
                    self._link_lend(st, lease)
        fx: list[Effect] = []
        if w.kind is WaitKind.GRANT:
            self.counters.grants += 1
            if rung == Rung.FIT.value and any(self.ledger.parked_on(p) for p in w.need):
                rung = Rung.BESIDE_RESIDUAL.value
            fx.append(Granted(w.lease_id, dict(w.need), rung))
            fx.append(Note(w.lease_id, "grant", f"{lease.engine} granted "
                           + ", ".join(f"{self._name(p)} {format_size(b)}" for p, b in w.need.items())
                           + f" ({rung})", {"rung": rung, "waited_s": now - w.since}))
        elif w.kind is WaitKind.RESUME:
            seq = next(self._seq)
            for pci in w.need:
                self.deadlines[(w.lease_id, pci, Op.WAKE)] = now + self.policy.wake_limit_s
            fx.append(Instruct(w.lease_id, Op.WAKE, tuple(w.need), seq, reason="room confirmed"))
            fx.append(Note(w.lease_id, "resume", f"{lease.engine} resuming ({rung})",
                           {"rung": rung, "waited_s": now - w.since}))
        elif w.kind is WaitKind.RETURN:
            seq = next(self._seq)
            for pci in w.need:
                self.deadlines[(w.lease_id, pci, Op.RETURN)] = now + self.policy.wake_limit_s
            fx.append(Instruct(w.lease_id, Op.RETURN, tuple(w.need), seq, dict(w.need),
                               reason="the borrower's memory is confirmed gone"))
            fx.append(Note(w.lease_id, "returning", f"{lease.engine} grows back "
                           + ", ".join(f"{self._name(p)}:{b}" for p, b in w.need.items()),
                           {"cards": dict(w.need), "waited_s": now - w.since}))
        else:
            self.counters.extensions += 1
            fx.append(Note(w.lease_id, "extend", f"{lease.engine} reservation extended by "
                           + ", ".join(f"{self._name(p)} {format_size(b)}"
                                       for p, b in w.need.items())))
        return fx

    def _link_lend(self, st: Step, borrower: Lease) -> None:
        lender = self.ledger.leases.get(st.lease_id)
        if lender is None:
            return
        pci = st.cards[0]
        lsh = lender.shares[pci]
        bsh = borrower.shares.get(pci)
        if lsh.state is S.LENT and lsh.lent_to is None and bsh is not None \
                and borrower.is_waiting() is False:
            lsh.lent_to = borrower.id
            bsh.borrowed_from = lender.id

    def _make_room(self, w: Waiter, now: float) -> list[Effect]:
        if w.lease_id in self.rooms:
            # A finished room that still did not make the waiter fit: plan again.
            if self.rooms[w.lease_id].pending:
                return []
            self.rooms.pop(w.lease_id)
        busy = frozenset(p for r in self.rooms.values() if r.pending for p in r.cards)
        p = plan(self.ledger, w, self.policy, now, self.swaps, busy)
        lease = self.ledger.leases[w.lease_id]
        if isinstance(p, NoPlan):
            if self._noplan_said.get(w.lease_id) != (p.reason, p.lasting):
                self._noplan_said[w.lease_id] = (p.reason, p.lasting)
                return [Note(w.lease_id, "wait", f"{lease.engine} waits: {p.reason}",
                             {"lasting": p.lasting})]
            return []
        if not p.steps:
            return []
        self._noplan_said.pop(w.lease_id, None)
        contested = frozenset(st.lease_id for st in p.steps
                              if not self.ledger.leases[st.lease_id].idle())
        self.rooms[w.lease_id] = Room(p, frozenset(w.need), {st.lease_id for st in p.steps}, now,
                                      contested)
        self.ledger.earmark(w.lease_id, w.need)
        fx: list[Effect] = [Note(w.lease_id, "plan", f"making room for {lease.engine} by "
                                 f"{p.rung}: " + ", ".join(
                                     f"{st.action} {st.engine}" + (f" ({st.why})" if st.why else "")
                                     for st in p.steps),
                                 {"rung": p.rung.value,
                                  "steps": [(st.action.value, st.engine) for st in p.steps]})]
        for st in p.steps:
            victim = self.ledger.leases[st.lease_id]
            reason = f"room for {lease.engine}"
            if st.jobs:
                reason += f", after its {jobs_words(st.jobs)}" if st.quiet_s else \
                    f", preempting its {jobs_words(st.jobs)}"
            # A park or lend waits for quiet only when jobs run now (its release grace counts
            # after that wait); a drain always lets a job that slipped in finish.
            quiet = st.quiet_s if st.jobs else None
            if st.action is Action.LEND:
                fx += self._begin_lend(victim, st.cards[0], st.lend_bytes, now, reason, quiet)
            elif st.action is Action.PARK:
                fx += self._begin_park(victim, now, reason, quiet)
            else:
                fx += self._stop(victim, now, reason, st.quiet_s)
        return fx

    def unextend(self, lease_id: str, now: float, reason: str = "withdrawn") -> list[Effect]:
        """The holder no longer wants the room it asked for with :meth:`extend` (issue 28: its
        prompt got a 503, its client went away, or the asker's process is gone): take the
        request out of the queue and drop the room being made for it, so the ladder never makes
        room later for nobody. A park already instructed goes on (only the driver settles a
        park); lends already confirmed grow back. No request of that kind: no effects."""
        lease = self.ledger.leases[lease_id]
        w = self.queue.get(lease_id)
        if w is None or w.kind is not WaitKind.EXTEND:
            return []
        self.queue.remove(lease_id)
        fx = self._cancel_room(lease_id, now)
        fx.append(Note(lease_id, "extend.off", f"{lease.engine}: its request for more room "
                                                f"ended ({reason})"))
        return fx + self._pass(now)

    def _cancel_room(self, lease_id: str, now: float) -> list[Effect]:
        """The waiter left: drop its room and earmark. Lends already confirmed grow back."""
        room = self.rooms.pop(lease_id, None)
        self.ledger.earmark(lease_id, {})
        self._noplan_said.pop(lease_id, None)
        fx: list[Effect] = []
        if room is None:
            return fx
        for st in room.plan.steps:
            lender = self.ledger.leases.get(st.lease_id)
            if st.action is Action.LEND and lender is not None:
                fx += self._want_return(lender, now)
        return fx
