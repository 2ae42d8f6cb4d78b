"""The broker's decisions as a pure state machine: events in, effects out.

This is the "scheduler with an effects table" of STYLE.md (after llama-swap's router design): it
performs no I/O and reads no clock. ``berth.daemon.broker`` feeds it events from the control API, the
runs, the driver and a timer, and carries out the :class:`Effect` values it returns; the policy
simulator (``bench/policy``) feeds it the same events in virtual time.

Events (methods) and what they do:

- :meth:`request` a lease; :meth:`withdraw` one still waiting.
- :meth:`extend` a reservation before growing; :meth:`unextend` (``Rooms``) withdraws the request.
- :meth:`observe` a driver read: free bytes, stowaways, each holder's use. Detects a parked share
  that loaded again (``lease.unparked``) and a growth-bound holder past its reservation.
- :meth:`confirmed`: the driver confirmation helper saw memory leave (``parked``, ``lent``) or
  free (``freed``). Only this moves a share to ``parked``, ``lent`` or ``freed`` (rule 1).
- :meth:`report`: a run says a wake, return, park, lend or drain finished, or failed. A success
  never frees memory by itself (rule 1): a park or lend reported done starts the driver
  confirmation (the event a read must follow); a failure falls back at once (rule 4).
- :meth:`exited`: the holder's process is gone.
- :meth:`wake`: a front holds a write for a parked engine.
- :meth:`operator`: park, wake, drain, hold, release-hold.
- :meth:`tick`: deadlines: ``release_grace`` (park, lend -> drain), ``wake_limit`` (wake,
  return -> stop).

Effects: :class:`Granted`, :class:`Instruct` (to the run that holds the lease), :class:`Watch`
(start a driver confirmation), :class:`Rejected`, :class:`Ended`, :class:`Note` (the timeline).
"""

from __future__ import annotations

import enum

from .admission import Waiter, WaitKind
from .deadlines import Deadlines
from .effects import (
    CardRead,
    Effect,
    Ended,
    Granted,
    Instruct,
    Note,
    ReadCards,
    Rejected,
    Until,
    Watch,
)
from .model import OPS, Lease, Op, ShareState
from .state import Room
from .units import format_size

S = ShareState

__all__ = ["Scheduler", "Effect", "Granted", "Instruct", "Watch", "Rejected", "Ended", "Note",
           "CardRead", "Room", "Until", "Hold", "ReadCards"]


class Hold(enum.StrEnum):
    """The operator's hold on a lease (no ladder may displace it), beside :class:`Op`'s park,
    wake and drain in :meth:`Scheduler.operator`."""

    HOLD = "hold"
    RELEASE = "release-hold"


class Scheduler(Deadlines):
    """The single writer of lease state. Not thread-safe: call it from one task.

    Every public method takes ``now`` (seconds) and returns the list of effects to carry out, in
    order. Raises ``KeyError`` for an unknown lease id and ``ValueError`` for a request that
    makes no sense (both change nothing).
    """

    # -- events -------------------------------------------------------------------------------
    def request(self, lease: Lease, now: float) -> list[Effect]:
        """Queue a new lease (all shares ``waiting``). Raises ``ValueError``/``KeyError``."""
        if lease.id in self.ledger.leases:
            raise ValueError(f"lease {lease.id}: already known")
        if not lease.shares:
            raise ValueError(f"lease {lease.id}: asks for no card")
        if any(sh.state is not S.WAITING for sh in lease.shares.values()):
            raise ValueError(f"lease {lease.id}: a new lease's shares must be waiting")
        lease.requested_at = now
        lease.last_used_at = now
        self.ledger.add_lease(lease)
        self.queue.push(Waiter(lease.id, WaitKind.GRANT, lease.priority, now, {}))
        fx: list[Effect] = [Note(lease.id, "request", f"{lease.engine} asks for "
                                 + ", ".join(f"{self._name(p)}" for p in lease.shares))]
        return fx + self._pass(now)

    def withdraw(self, lease_id: str, now: float, reason: str = "withdrawn") -> list[Effect]:
        """Take back a lease that is still waiting. A granted lease must be released instead."""
        lease = self.ledger.leases[lease_id]
        if not lease.is_waiting():
            raise ValueError(f"lease {lease_id}: not waiting (it is "
                             f"{', '.join(sorted(st.value for st in lease.states()))}); "
                             f"release it instead")
        fx = self._cancel_room(lease_id, now)
        self.queue.remove(lease_id)
        for pci in lease.shares:
            self.ledger.move(lease_id, pci, S.FREED, now)
        self._drop(lease_id)
        fx.append(Ended(lease_id, reason))
        return fx + self._pass(now)

    def attach(self, lease_id: str, pid: int, start_time: float, now: float) -> list[Effect]:
        """Record the holder's process identity (PID and start time)."""
        lease = self.ledger.leases[lease_id]
        lease.pid, lease.start_time = pid, start_time
        if lease.restarting_until is not None:
            lease.restarting_until = None
            return [Note(lease_id, "attach", f"{lease.engine} restarted as pid {pid}; it "
                                             f"keeps its room")]
        return [Note(lease_id, "attach", f"{lease.engine} runs as pid {pid}")]

    def jobs(self, lease_id: str, in_flight: int, now: float,
             oldest_at: float | None = None) -> list[Effect]:
        """The holder's front forwards ``in_flight`` requests now (its run reports each change).
        A holder that goes idle yields at once to anyone waiting (issue 16), so the admission
        pass runs then; a busy one's park or drain waits for its jobs, up to its ``max_job``
        (issue 12 case 4). ``oldest_at``: when the oldest of those requests arrived (seconds, the
        scheduler's clock; ``None`` when the front does not say). Raises ``ValueError`` for a
        negative count."""
        if in_flight < 0:
            raise ValueError(f"in_flight: expected a count >= 0, got {in_flight}")
        lease = self.ledger.leases[lease_id]
        if in_flight and not lease.in_flight:
            lease.busy_since = now
        elif not in_flight:
            lease.busy_since = None
        went_idle = not in_flight and (lease.in_flight or not lease.jobs_reported)
        # Its older requests ended: a waiter that asked before the ones left may go now.
        moved_on = lease.oldest_job_at is not None and (
            oldest_at is None or oldest_at > lease.oldest_job_at)
        lease.in_flight, lease.jobs_reported = in_flight, True
        lease.oldest_job_at = oldest_at if in_flight else None
        lease.last_used_at = now
        return self._pass(now) if (went_idle or moved_on) and len(self.queue) else []

    def touch(self, lease_id: str, now: float) -> list[Effect]:
        """The engine served a request (for least-recently-used victim order)."""
        self.ledger.leases[lease_id].last_used_at = now
        return []

    def ready(self, lease_id: str, now: float) -> list[Effect]:
        """The engine answered after its grant: its minimum turn starts now, not at the grant
        (a cold load longer than the minimum turn must not lose the card before it serves)."""
        lease = self.ledger.leases[lease_id]
        if lease.ready_at is None or (lease.granted_at is not None and lease.ready_at < lease.granted_at):
            lease.ready_at = now
            if lease.granted_at is not None:
                lease.switch_cost_s = now - lease.granted_at
            return [Note(lease_id, "ready", f"{lease.engine} is serving")] + self._pass(now)
        return []

    def observe(self, reads: dict[str, CardRead], now: float) -> list[Effect]:
        """Take in a driver read per card (PCI address -> :class:`CardRead`)."""
        fx: list[Effect] = []
        led = self.ledger
        for pci, r in reads.items():
            card = led.cards.get(pci)
            if card is None:
                continue
            card.free_bytes, card.read_at = r.free_bytes, now
            card.stowaway_bytes = r.stowaway_bytes
            card.stowaways = dict(r.stowaways)
            if r.total_bytes is not None:
                card.total_bytes = r.total_bytes
            for lid, used in r.used.items():
                lease = led.leases.get(lid)
                if lease is None or pci not in lease.shares:
                    continue
                sh = led.update(lid, pci, used_bytes=used)
                # Growth is what a serving engine adds; its load or restore is not growth.
                serving = sh.state is S.ACTIVE and lease.ready_at is not None and \
                    now - max(sh.since, lease.ready_at) > self.policy.read_interval_s
                if used is not None and serving:
                    self.growth.record(lid, pci, used, now)
                else:
                    self.growth.reset(lid, pci)
                fx += self._after_use(lease, sh, now)
        return fx + self._pass(now)

    def confirmed(self, lease_id: str, pci: str, what: str, now: float,
                  use_bytes: int | None = None) -> list[Effect]:
        """A driver read taken after the event showed the memory left (``parked``, ``lent``) or
        free (``freed``). ``use_bytes`` is the holder's measured use then (the residual of a
        park). A confirmation that no longer matches the share's state is ignored."""
        lease = self.ledger.leases.get(lease_id)
        if lease is None or pci not in lease.shares:
            return []
        sh = lease.shares[pci]
        fx: list[Effect] = []
        if what == Until.PARKED and sh.state is S.PARKING:
            self.ledger.move(lease_id, pci, S.PARKED, now, residual_bytes=use_bytes or 0,
                             used_bytes=use_bytes)
            self.deadlines.pop((lease_id, pci, Op.PARK), None)
            if all(s.state is S.PARKED for s in lease.shares.values()):
                fx.append(Note(lease_id, "parked", f"{lease.engine} parked; residual "
                               f"{self._bytes_on(lease, 'residual_bytes')}"))
                self._step_done(lease_id)
                if lease_id in self.wake_wanted:
                    self.wake_wanted.discard(lease_id)
                    fx += self._want_resume(lease, now)
        elif what == Until.LENT and sh.state is S.LENDING:
            self.ledger.move(lease_id, pci, S.LENT, now, used_bytes=use_bytes)
            self.deadlines.pop((lease_id, pci, Op.LEND), None)
            fx.append(Note(lease_id, "lent", f"{lease.engine} lent {format_size(sh.lent_bytes)} on "
                           f"{self._name(pci)}", {"card": pci, "bytes": sh.lent_bytes}))
            if not self._step_done(lease_id):
                fx += self._want_return(lease, now)     # nobody is waiting for it any more
        elif what == Until.FREED and sh.state in (S.DRAINING, S.RELEASED):
            if sh.state is S.DRAINING:
                self.ledger.move(lease_id, pci, S.RELEASED, now)
            fx += self._freed(lease, pci, now)
        else:
            return []
        return fx + self._pass(now)

    def report(self, lease_id: str, op: str, ok: bool, now: float, detail: str = "") -> list[Effect]:
        """A run's word on an instruction. Success of park or lend changes nothing (the driver
        decides); failure of park, lend, wake or return falls back to drain at once; a drain
        report means the engine process has exited."""
        if op not in OPS:
            raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")
        lease = self.ledger.leases.get(lease_id)
        if lease is None:
            return []
        fx: list[Effect] = []
        sts = lease.states()
        if op in (Op.WAKE, Op.RETURN):
            src = S.RESUMING if op == Op.WAKE else S.RETURNING
            for pci, sh in lease.shares.items():
                if sh.state is not src:
                    continue
                self.deadlines.pop((lease_id, pci, op), None)
                if ok:
                    if op == Op.WAKE:
                        lease.switch_cost_s = now - sh.since
                    self.ledger.move(lease_id, pci, S.ACTIVE, now, lent_bytes=0)
            if src in sts:
                if ok:
                    lease.last_used_at = now
                    if op == Op.WAKE:
                        self.counters.wakes += 1
                    else:
                        self.counters.returns += 1
                    fx.append(Note(lease_id, op, f"{lease.engine} {'woke' if op == Op.WAKE else 'grew back'}"))
                else:
                    fx += self._fallback(lease, now, f"{op} failed: {detail or 'no reason given'}")
        elif op in (Op.PARK, Op.LEND):
            src = S.PARKING if op == Op.PARK else S.LENDING
            if not ok and src in sts and op == Op.PARK and detail.startswith("busy") \
                    and not self._awaited(lease_id):
                # The engine was never touched (its front could not go quiet in time) and
                # nothing waits for the room: call the park off rather than stop it.
                for pci, sh in lease.shares.items():
                    if sh.state is S.PARKING:
                        self.ledger.move(lease_id, pci, S.ACTIVE, now, parked_bytes=0)
                        self.deadlines.pop((lease_id, pci, Op.PARK), None)
                fx.append(Note(lease_id, "park.off", f"{lease.engine}: park called off, nothing "
                               f"waits for the room ({detail})"))
            elif not ok and src in sts:
                fx += self._fallback(lease, now, f"{op} failed: {detail or 'no reason given'}")
            elif ok:
                # The run says it is done: that is the event a driver read must follow (rule 1).
                # Its word is not proof; the confirmation is, within the release grace.
                for pci, sh in lease.shares.items():
                    if sh.state is not src:
                        continue
                    # The deadline covered the front's wait for quiet (up to max_job); the
                    # engine is done now, so the driver has the release grace from here.
                    due = min(self.deadlines.get((lease_id, pci, op), float("inf")),
                              now + self.policy.release_grace_s)
                    self.deadlines[(lease_id, pci, op)] = due
                    limit = self._max_residual(lease, pci) if op == Op.PARK else \
                        max(0, sh.reserved_bytes - sh.lent_bytes)
                    fx.append(Watch(lease_id, pci, Until.PARKED if op == Op.PARK else Until.LENT, limit,
                                    now, max(due, now)))
        elif op == Op.DRAIN:
            fx += self.exited(lease_id, now, final=True)
            return fx
        return fx + self._pass(now)

    def wake(self, lease_id: str, now: float) -> list[Effect]:
        """A front holds a write for this lease: queue its resume if it is parked (or once its
        park settles). Waking an active lease does nothing."""
        lease = self.ledger.leases[lease_id]
        lease.last_used_at = now
        sts = lease.states()
        if S.PARKED in sts:
            return self._want_resume(lease, now) + self._pass(now)
        if S.PARKING in sts:
            self.wake_wanted.add(lease_id)
            return [Note(lease_id, "wake", f"{lease.engine}: wake asked while parking; it "
                                            f"resumes once the park settles")]
        return [Note(lease_id, "wake.none", f"{lease.engine} is not parked (it is "
                                             f"{', '.join(sorted(st.value for st in sts))}); "
                                             f"nothing to wake")]

    def extend(self, lease_id: str, pci: str, n_bytes: int, now: float) -> list[Effect]:
        """The holder asks for ``n_bytes`` more on ``pci`` *before* it grows (issue 13: ComfyUI
        before a prompt whose model files pass its reservation). Queued as seed 000's extension
        event, so the ladder makes room first; at most the share's size. Raises ``KeyError``
        for a card the lease has no share on, ``ValueError`` unless that share is active."""
        lease = self.ledger.leases[lease_id]
        sh = lease.shares.get(pci)
        if sh is None:
            raise KeyError(f"lease {lease_id!r} has no share on {pci}")
        if sh.state is not S.ACTIVE:
            raise ValueError(f"{lease.engine}'s share on {self._name(pci)} is {sh.state.value}; "
                             f"only an active share extends")
        n = min(int(n_bytes), sh.size_bytes - sh.reserved_bytes)
        if n <= 0 or lease_id in self.queue:
            return []
        self.queue.push(Waiter(lease_id, WaitKind.EXTEND, lease.priority, now, {pci: n}))
        return [Note(lease_id, "extend.asked", f"{lease.engine} asks for {format_size(n)} more "
                     f"on {self._name(pci)} before it grows")] + self._pass(now)

    def unwake(self, lease_id: str, now: float) -> list[Effect]:
        """Every request that asked for this wake has gone (answered 503 at its deadline): take
        the wake out of the queue, so it does not later displace an engine in use for nobody.
        A wake already granted (resuming) goes on."""
        lease = self.ledger.leases[lease_id]
        self.wake_wanted.discard(lease_id)
        w = self.queue.get(lease_id)
        if w is None or w.kind is not WaitKind.RESUME:
            return []
        self.queue.remove(lease_id)
        fx = self._cancel_room(lease_id, now)
        fx.append(Note(lease_id, "wake.off", f"{lease.engine}: the requests that asked for the "
                                              f"wake have gone; it stays parked"))
        return fx + self._pass(now)

    def operator(self, op: str, lease_id: str, now: float) -> list[Effect]:
        """Operator actions: ``park``, ``wake``, ``drain``, ``hold``, ``release-hold``.
        Raises ``ValueError`` when the lease cannot do it (a park needs a declared park and a
        front; rule 3)."""
        lease = self.ledger.leases[lease_id]
        if op == Hold.HOLD:
            lease.held = True
            return [Note(lease_id, "hold", f"{lease.engine} held by the operator")]
        if op == Hold.RELEASE:
            lease.held = False
            return [Note(lease_id, "hold", f"{lease.engine} no longer held")] + self._pass(now)
        if op == Op.WAKE:
            return self.wake(lease_id, now)
        if op == Op.PARK:
            if not lease.caps.can_park():
                missing = "--park" if lease.caps.park is None else "--front"
                raise ValueError(f"lease {lease_id}: {lease.engine} cannot park: its run gave no "
                                 f"{missing} (`berth run --front HOST:PORT --park "
                                 f"checkpoint|hook` makes an engine parkable); `berth drain "
                                 f"{lease.engine}` stops it instead")
            if not all(sh.state is S.ACTIVE for sh in lease.shares.values()):
                raise ValueError(f"lease {lease_id}: {lease.engine} can only park when every "
                                 f"share is active; it is "
                                 f"{', '.join(sorted(st.value for st in lease.states()))}")
            return self._begin_park(lease, now, "operator") + self._pass(now)
        if op == Op.DRAIN:
            if lease.is_waiting():
                return self.withdraw(lease_id, now, "drained by the operator while waiting")
            return self._stop(lease, now, "operator") + self._pass(now)
        raise ValueError(f"op: expected park, wake, drain, hold or release-hold, got {op!r}")
