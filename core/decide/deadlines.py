"""Deadlines and restarts: what happens when a park, lend, wake, return or drain outlives its
limit, how a lease taken back from the state file re-arms what it waits for, and what a
holder's exit does (with the restart hold of a process its supervisor restarts).

Source: seed 002 rules 4 (fall back to a drain) and 5 (the state file survives a restart),
issue 4, issue 12 case 2. Pure: no I/O, no clock.
"""

from __future__ import annotations

from .actions import ending_fields
from .admission import Waiter, WaitKind
from .effects import Effect, Ended, Instruct, Note, Until
from .ledger import RESIDUAL_SLACK_BYTES as SLACK
from .model import LIVE_STATES, Lease, Op, ShareState, move
from .rooms import Rooms

S = ShareState

__all__ = ["Deadlines"]


class Deadlines(Rooms):
    """:meth:`tick` acts on deadlines that passed; :meth:`adopt` takes a lease back after a
    restart; :meth:`exited`: the holder's process is gone."""

    def exited(self, lease_id: str, now: float, final: bool = False) -> list[Effect]:
        """The lease's process is gone. Live shares become ``released`` (they count until a
        driver read shows them free); a waiting lease is withdrawn.

        Unless ``final`` (a release, a reported drain, a restart hold that ran out): a lease
        with ``restart_grace_s`` whose shares are all active and that was asked for nothing
        keeps its room while its supervisor restarts the process: its PID is cleared for
        ``attach`` and nothing else changes until ``restarting_until`` (issue 12 case 2)."""
        lease = self.ledger.leases.get(lease_id)
        if lease is None:
            return []
        if lease.is_waiting():
            return self.withdraw(lease_id, now, "process exited while waiting")
        if not final and lease.restart_grace_s > 0 and lease.states() == {S.ACTIVE} \
                and not any(key[0] == lease_id for key in self.deadlines):
            if lease.restarting_until is not None:
                return []                    # the hold runs; the dead PID is old news
            lease.restarting_until = now + lease.restart_grace_s
            pid, lease.pid, lease.start_time = lease.pid, None, None
            return [Note(lease_id, "restart", f"{lease.engine}: pid {pid} exited; its room is "
                                              f"kept up to {lease.restart_grace_s:g}s while its "
                                              f"supervisor restarts it")]
        lease.restarting_until = None
        fx = self._cancel_room(lease_id, now)
        self.queue.remove(lease_id)
        self.wake_wanted.discard(lease_id)
        lease.in_flight, lease.busy_since = 0, None
        moved = False
        for pci, sh in lease.shares.items():
            if sh.state is S.WAITING:
                self.ledger.move(lease_id, pci, S.FREED, now)
            elif sh.state in LIVE_STATES:
                for op in Op:
                    self.deadlines.pop((lease_id, pci, op), None)
                self.ledger.move(lease_id, pci, S.RELEASED, now, **ending_fields(sh))
                fx.append(self._watch(lease, pci, Until.FREED, 0, now, self.policy.release_grace_s))
                moved = True
        if moved:
            # One exit is news once: the run's drain report, its release and the reader's
            # sight of the dead process all come here (issue 12 case 7).
            fx.append(Note(lease_id, "exit", f"{lease.engine} exited"))
        if lease.is_over():
            self._drop(lease_id)
            fx.append(Ended(lease_id, "exited"))
        return fx + self._pass(now)

    def tick(self, now: float) -> list[Effect]:
        """Act on deadlines that have passed, then run an admission pass."""
        fx: list[Effect] = []
        for (lid, pci, op), due in sorted(self.deadlines.items(), key=lambda kv: kv[1]):
            if due > now or (lid, pci, op) not in self.deadlines:
                continue
            del self.deadlines[(lid, pci, op)]
            lease = self.ledger.leases.get(lid)
            if lease is None:
                continue
            sh = lease.shares[pci]
            if op in (Op.PARK, Op.LEND) and sh.state in (S.PARKING, S.LENDING):
                fx += self._fallback(lease, now, f"{op} not confirmed by the driver within "
                                                 f"release_grace ({self.policy.release_grace_s:g}s)")
            elif op in (Op.WAKE, Op.RETURN) and sh.state in (S.RESUMING, S.RETURNING):
                fx += self._fallback(lease, now, f"{op} did not answer within wake_limit "
                                             f"({self.policy.wake_limit_s:g}s)")
            elif op == Op.DRAIN and sh.state in (S.DRAINING, S.RELEASED):
                fx.append(Note(lid, "drain.overdue", f"{lease.engine}: memory on "
                               f"{self._name(pci)} not free {self.policy.release_grace_s:g}s "
                               f"after the drain; still watching", {"card": pci}))
        for lease in [le for le in self.ledger.leases.values()
                      if le.restarting_until is not None and le.restarting_until <= now]:
            fx.append(Note(lease.id, "restart.over", f"{lease.engine}: not restarted within "
                                                     f"{lease.restart_grace_s:g}s; its room goes"))
            fx += self.exited(lease.id, now, final=True)
        self.swaps.prune(now - self.policy.juggle_window_s)
        return fx + self._pass(now)

    def adopt(self, lease: Lease, now: float, waiting: str | None = None,
              since: float | None = None,
              use: dict[str, int | None] | None = None) -> list[Effect]:
        """Take back a lease from the state file after a restart (rule 5). ``use`` is each
        card's measured use by the lease's processes now ({pci: bytes}, ``None`` where the
        driver cannot say; a card missing counts as ``None``): shares caught mid-transition
        are settled by it first (issue 4):

        - parking: the memory left (use ≤ :func:`~.ledger.max_residual`) → parked, else → active;
        - lending: N left the holder → lent, else → active (nothing was lent);
        - resuming: the memory is back (use > residual + slack) → active, else it stays resuming
          and the wake is asked again;
        - returning(N): the holder grew back (use > reserved − N + slack) → active, else it
          stays returning and the return of N is asked again (room for it was confirmed
          before the return began);
        - draining, released: watched until the driver shows them free.

        Then re-arms what each state waits for: a wake, return or drain is asked again and its
        deadline restarts; released shares are watched until free; a lent share with no
        borrower grows back. ``waiting`` re-queues the lease as that kind of waiter."""
        for pci in lease.shares:
            self._settle(lease, pci, (use or {}).get(pci), now)
        self.ledger.add_lease(lease)
        fx: list[Effect] = []
        p = self.policy
        # What each transitional state waits for, and how long (the deadline restarts).
        waits = {S.RESUMING: (Op.WAKE, p.wake_limit_s), S.RETURNING: (Op.RETURN, p.wake_limit_s),
                 S.PARKING: (Op.PARK, p.release_grace_s), S.LENDING: (Op.LEND, p.release_grace_s),
                 S.DRAINING: (Op.DRAIN, p.release_grace_s),
                 S.RELEASED: (Op.DRAIN, p.release_grace_s)}
        for pci, sh in lease.shares.items():
            if sh.state in waits:
                op, limit_s = waits[sh.state]
                self.deadlines[(lease.id, pci, op)] = now + limit_s
            if sh.state is S.RELEASED:
                fx.append(self._watch(lease, pci, Until.FREED, 0, now, p.release_grace_s))
        for op, st in ((Op.WAKE, S.RESUMING), (Op.RETURN, S.RETURNING), (Op.DRAIN, S.DRAINING),
                       (Op.PARK, S.PARKING), (Op.LEND, S.LENDING)):
            cards = tuple(pci for pci, sh in lease.shares.items() if sh.state is st)
            if cards:
                n = {pci: lease.shares[pci].lent_bytes for pci in cards} \
                    if op in (Op.LEND, Op.RETURN) else {}
                fx.append(Instruct(lease.id, op, cards, next(self._seq), n,
                                   reason="re-attached after a restart"))
        if waiting is not None and lease.id not in self.queue:
            self.queue.push(Waiter(lease.id, WaitKind(waiting), lease.priority,
                                   now if since is None else since, {}))
        fx += self._want_return(lease, now)
        fx.append(Note(lease.id, "reattach", f"{lease.engine} re-attached: "
                       + ", ".join(f"{self._name(pci)} {sh.state}"
                                   for pci, sh in lease.shares.items())))
        return fx

    def _settle(self, lease: Lease, pci: str, use: int | None, now: float) -> None:
        """Settle one share caught mid-transition by a restart, by its measured use (bytes)."""
        sh = lease.shares[pci]
        if sh.state is S.PARKING:
            if use is not None and use <= self._max_residual(lease, pci):
                move(sh, S.PARKED, now)
                sh.residual_bytes = use
            else:
                move(sh, S.ACTIVE, now)
        elif sh.state is S.LENDING:
            if use is not None and use <= sh.reserved_bytes - sh.lent_bytes:
                move(sh, S.LENT, now)
            else:
                move(sh, S.ACTIVE, now)
                sh.lent_bytes = 0
        elif sh.state is S.RESUMING:
            if use is not None and use > sh.residual_bytes + SLACK:
                move(sh, S.ACTIVE, now)
        elif sh.state is S.RETURNING:
            # The run may have died with berthd before it read its return instruction: only a
            # use that shows the growth settles it; else the return is asked again (issue 18).
            # A share with no N recorded (a state file of an older berthd) has nothing to ask.
            if sh.lent_bytes == 0 or (
                    use is not None and use > sh.reserved_bytes - sh.lent_bytes + SLACK):
                move(sh, S.ACTIVE, now)
                sh.lent_bytes = 0
        if use is not None:
            sh.used_bytes = use
