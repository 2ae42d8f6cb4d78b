"""The scheduler's actions on a lease: park, lend, drain (stop), fall back, ask for a wake or a
return, and what a driver read of its use or a freed share leads to.

Source: seed 002 rules 1 (only the driver confirms memory moved), 2 (a lender's return) and 4
(a park or lend that fails falls back to a drain). Pure: no I/O, no clock.
"""

from __future__ import annotations

from .admission import Waiter, WaitKind
from .effects import Effect, Ended, Instruct, Note
from .ledger import RESIDUAL_SLACK_BYTES as SLACK
from .ledger import counted_bytes
from .model import LIVE_STATES, Bound, Lease, Op, ParkMechanism, Share, ShareState
from .state import SchedulerState
from .units import format_size

S = ShareState

__all__ = ["Actions"]


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


class Actions(SchedulerState):
    """Each method changes the ledger for one lease and returns the effects to carry out."""

    def _begin_park(self, lease: Lease, now: float, reason: str,
                    quiet_s: float | None = None) -> list[Effect]:
        """Park: the front first waits up to ``quiet_s`` for the requests in flight (issue 12
        case 4), so the release grace counts from after that wait."""
        seq = next(self._seq)
        fx: list[Effect] = [Instruct(lease.id, Op.PARK, tuple(lease.shares), seq, reason=reason,
                                     quiet_s=quiet_s)]
        for pci, sh in lease.shares.items():
            self.ledger.move(lease.id, pci, S.PARKING, now, parked_bytes=counted_bytes(sh))
            self.deadlines[(lease.id, pci, Op.PARK)] = now + (quiet_s or 0.0) \
                + self.policy.release_grace_s
        if lease.caps.park is ParkMechanism.CHECKPOINT:
            self.counters.checkpoints += 1
        else:
            self.counters.parks += 1
        fx.append(Note(lease.id, "park", f"{lease.engine} parks by {lease.caps.park} ({reason})"))
        return fx

    def _begin_lend(self, lease: Lease, pci: str, n: int, now: float, reason: str,
                    quiet_s: float | None = None) -> list[Effect]:
        self.ledger.move(lease.id, pci, S.LENDING, now, lent_bytes=n)
        self.deadlines[(lease.id, pci, Op.LEND)] = now + (quiet_s or 0.0) \
            + self.policy.release_grace_s
        self.counters.lends += 1
        return [Instruct(lease.id, Op.LEND, (pci,), next(self._seq), {pci: n}, reason=reason,
                         quiet_s=quiet_s),
                Note(lease.id, "lend", f"{lease.engine} lends {format_size(n)} on {self._name(pci)} "
                     f"({reason})", {"card": pci, "bytes": n})]

    def _stop(self, lease: Lease, now: float, reason: str,
              quiet_s: float | None = None) -> list[Effect]:
        """Drain: every live share -> draining, and tell the run to stop its engine, after its
        requests in flight end if ``quiet_s`` allows (issue 12 case 4)."""
        fx: list[Effect] = []
        moved = False
        for pci, sh in lease.shares.items():
            if sh.state in LIVE_STATES and sh.state is not S.DRAINING:
                self.ledger.move(lease.id, pci, S.DRAINING, now, **ending_fields(sh))
                for op in (Op.PARK, Op.LEND, Op.WAKE, Op.RETURN):
                    self.deadlines.pop((lease.id, pci, op), None)
                # The freed-watch starts when the process is gone (exited), not before.
                self.deadlines[(lease.id, pci, Op.DRAIN)] = now + self.policy.release_grace_s
                moved = True
        if moved:
            self.queue.remove(lease.id)
            self.wake_wanted.discard(lease.id)
            self.counters.drains += 1
            fx.insert(0, Instruct(lease.id, Op.DRAIN, tuple(lease.shares), next(self._seq),
                                  reason=reason, quiet_s=quiet_s))
            fx.append(Note(lease.id, "drain", f"{lease.engine} drains ({reason})"))
        return fx

    def _fallback(self, lease: Lease, now: float, why: str) -> list[Effect]:
        """Rule 4: a park or lend that did not free the memory, or a wake or return that did
        not answer, falls back to a drain. A room that counted on the step is now made by a
        drain, and its grant says so."""
        self.counters.fallbacks_to_drain += 1
        for room in self.rooms.values():
            if lease.id in room.pending:
                room.fell_back.add(lease.id)
        fx: list[Effect] = [Note(lease.id, "fallback", f"{lease.engine}: {why}; falling back "
                                                       f"to drain")]
        return fx + self._stop(lease, now, f"fallback: {why}")

    def _want_resume(self, lease: Lease, now: float) -> list[Effect]:
        if lease.id in self.queue:
            return []
        self.queue.push(Waiter(lease.id, WaitKind.RESUME, lease.priority, now, {}))
        return [Note(lease.id, "wake", f"{lease.engine}: wake asked; waiting for room")]

    def _want_return(self, lease: Lease, now: float) -> list[Effect]:
        if lease.id in self.queue or not any(
                sh.state is S.LENT and sh.lent_to is None for sh in lease.shares.values()):
            return []
        self.queue.push(Waiter(lease.id, WaitKind.RETURN, lease.priority, now, {}))
        return [Note(lease.id, "return", f"{lease.engine}: its lend is no longer used; "
                                         f"growing back once the driver confirms")]

    def _freed(self, lease: Lease, pci: str, now: float) -> list[Effect]:
        sh = self.ledger.move(lease.id, pci, S.FREED, now)
        self.deadlines.pop((lease.id, pci, Op.DRAIN), None)
        fx: list[Effect] = []
        # The freed entry first: the lender's return follows from it (rule 2), and the
        # timeline must show them in that order.
        if lease.is_over():
            self._step_done(lease.id)
            self._drop(lease.id)
            fx.append(Ended(lease.id, "freed"))
            fx.append(Note(lease.id, "freed", f"{lease.engine}: memory confirmed free"))
        if sh.borrowed_from:
            lender = self.ledger.leases.get(sh.borrowed_from)
            if lender is not None and pci in lender.shares \
                    and lender.shares[pci].lent_to == lease.id:
                self.ledger.update(lender.id, pci, lent_to=None)
                fx += self._want_return(lender, now)
        return fx

    def _after_use(self, lease: Lease, sh: Share, now: float) -> list[Effect]:
        used = sh.used_bytes
        if used is None:
            return []
        if sh.state is S.PARKED and used > sh.residual_bytes + max(SLACK, sh.residual_bytes // 20):
            # "A share that loads more than it may while asleep goes back to active and is
            # reported (lease.unparked), so the next drain parks it again."
            self.ledger.move(lease.id, sh.card, S.ACTIVE, now)
            self.queue.remove(lease.id)
            self.counters.unparked += 1
            return [Note(lease.id, "lease.unparked", f"{lease.engine} loaded {format_size(used)} on "
                         f"{self._name(sh.card)} while parked; counted active again",
                         {"card": sh.card, "used_bytes": used}),
                    Instruct(lease.id, Op.WAKE, (sh.card,), next(self._seq), reason="unparked")]
        key = (lease.id, sh.card)
        if sh.state is S.ACTIVE and used > sh.reserved_bytes + SLACK:
            if key not in self._over:
                self._over.add(key)
                fx_over = [Note(lease.id, "over_lease", f"{lease.engine} uses {format_size(used)} on "
                                f"{self._name(sh.card)}, more than its lease's "
                                f"{format_size(sh.reserved_bytes)}"
                                f"; counted at its use, not its lease",
                                {"card": sh.card, "used_bytes": used,
                                 "reserved_bytes": sh.reserved_bytes})]
            else:
                fx_over = []
        else:
            self._over.discard(key)
            fx_over = []
        if sh.state is S.ACTIVE and lease.bound is Bound.GROWTH and used > sh.reserved_bytes \
                and lease.id not in self.queue:
            want = min(sh.size_bytes, used + lease.growth_allowance_bytes) - sh.reserved_bytes
            if want > 0:
                self.queue.push(Waiter(lease.id, WaitKind.EXTEND, lease.priority, now,
                                       {sh.card: want}))
        return fx_over
