"""The broker's decisions as a pure state machine: events in, effects out.

This is the "scheduler with an effects table" of STYLE.md (after llama-swap's router design): it
performs no I/O and reads no clock. ``berth.daemon.broker`` feeds it events from the control API, the
runs, the driver and a timer, and carries out the :class:`Effect` values it returns; the policy
simulator (``bench/policy``) feeds it the same events in virtual time.

Events (methods) and what they do:

- :meth:`request` a lease; :meth:`withdraw` one still waiting.
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
import itertools
from dataclasses import dataclass

from .effects import CardRead, Effect, Ended, Granted, Instruct, Note, Rejected, Until, Watch
from .admission import Policy, Queue, WaitKind, Waiter, admission_pass
from .ladder import Action, NoPlan, Plan, Rung, Step, SwapLog, plan
from .ledger import RESIDUAL_SLACK_BYTES as SLACK, Ledger, counted_bytes, max_residual
from .measures import Counters, GrowthMeter
from .model import LIVE_STATES, OPS, Op, Bound, Lease, ParkMechanism, Share, ShareState, move
from .units import format_size

__all__ = ["Scheduler", "Effect", "Granted", "Instruct", "Watch", "Rejected", "Ended", "Note",
           "CardRead", "Room", "Until", "Hold"]

S = ShareState


@dataclass
class Room:
    """Room being made for one waiter: the plan, the waiter's cards, and the victims (lease
    ids) whose steps the driver has not confirmed yet."""

    plan: Plan
    cards: frozenset[str]
    pending: set[str]
    since: float



def _ending(sh: Share) -> dict:
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


class Hold(enum.StrEnum):
    """The operator's hold on a lease (no ladder may displace it), beside :class:`Op`'s park,
    wake and drain in :meth:`Scheduler.operator`."""

    HOLD = "hold"
    RELEASE = "release-hold"


class Scheduler:
    """The single writer of lease state. Not thread-safe: call it from one task.

    Every public method takes ``now`` (seconds) and returns the list of effects to carry out, in
    order. Raises ``KeyError`` for an unknown lease id and ``ValueError`` for a request that
    makes no sense (both change nothing).
    """

    def __init__(self, policy: Policy, ledger: Ledger | None = None, first_seq: int = 1):
        self.policy = policy
        self.ledger = ledger or Ledger()
        self.queue = Queue()
        self.rooms: dict[str, Room] = {}
        self.swaps = SwapLog()
        self.counters = Counters()
        self.growth = GrowthMeter()
        self.deadlines: dict[tuple[str, str, str], float] = {}   # (lease, pci, op) -> time
        self.wake_wanted: set[str] = set()
        self._seq = itertools.count(first_seq)
        self._noplan_said: dict[str, str] = {}
        self._over: set[tuple[str, str]] = set()

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
        return [Note(lease_id, "attach", f"{lease.engine} runs as pid {pid}")]

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
                    self.ledger.move(lease_id, pci, S.ACTIVE, now)
            if src in sts:
                if ok:
                    lease.last_used_at = now
                    if op == Op.WAKE:
                        self.counters.wakes += 1
                    else:
                        self.counters.returns += 1
                    fx.append(Note(lease_id, op, f"{lease.engine} {'woke' if op == Op.WAKE else 'grew back'}"))
                else:
                    fx += self._stop(lease, now, f"{op} failed: {detail or 'no reason given'}")
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
                    due = self.deadlines.get((lease_id, pci, op), now + self.policy.release_grace_s)
                    limit = self._max_residual(lease, pci) if op == Op.PARK else \
                        max(0, sh.reserved_bytes - sh.lent_bytes)
                    fx.append(Watch(lease_id, pci, Until.PARKED if op == Op.PARK else Until.LENT, limit,
                                    now, max(due, now)))
        elif op == Op.DRAIN:
            fx += self.exited(lease_id, now)
            return fx
        return fx + self._pass(now)

    def exited(self, lease_id: str, now: float) -> list[Effect]:
        """The lease's process is gone. Live shares become ``released`` (they count until a
        driver read shows them free); a waiting lease is withdrawn."""
        lease = self.ledger.leases.get(lease_id)
        if lease is None:
            return []
        if lease.is_waiting():
            return self.withdraw(lease_id, now, "process exited while waiting")
        fx = self._cancel_room(lease_id, now)
        self.queue.remove(lease_id)
        self.wake_wanted.discard(lease_id)
        for pci, sh in lease.shares.items():
            for op in Op:
                self.deadlines.pop((lease_id, pci, op), None)
            if sh.state is S.WAITING:
                self.ledger.move(lease_id, pci, S.FREED, now)
            elif sh.state in LIVE_STATES:
                self.ledger.move(lease_id, pci, S.RELEASED, now, **_ending(sh))
                fx.append(self._watch(lease, pci, Until.FREED, 0, now, self.policy.release_grace_s))
        fx.append(Note(lease_id, "exit", f"{lease.engine} exited"))
        if lease.is_over():
            self._drop(lease_id)
            fx.append(Ended(lease_id, "exited"))
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
                raise ValueError(f"lease {lease_id}: {lease.engine} declared no park with a "
                                 f"front (park={lease.caps.park}, front={lease.caps.front})")
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
                fx += self._stop(lease, now, f"{op} did not answer within wake_limit "
                                             f"({self.policy.wake_limit_s:g}s)")
            elif op == Op.DRAIN and sh.state in (S.DRAINING, S.RELEASED):
                fx.append(Note(lid, "drain.overdue", f"{lease.engine}: memory on "
                               f"{self._name(pci)} not free {self.policy.release_grace_s:g}s "
                               f"after the drain; still watching", {"card": pci}))
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
        - returning: → active (room for it was confirmed before the return began);
        - draining, released: watched until the driver shows them free.

        Then re-arms what each state waits for: a wake, return or drain is asked again and its
        deadline restarts; released shares are watched until free; a lent share with no
        borrower grows back. ``waiting`` re-queues the lease as that kind of waiter."""
        for pci, sh in lease.shares.items():
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
                n = {pci: lease.shares[pci].lent_bytes for pci in cards} if op == Op.LEND else {}
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
            move(sh, S.ACTIVE, now)
        if use is not None:
            sh.used_bytes = use

    # -- the admission pass ------------------------------------------------------------------
    def _pass(self, now: float) -> list[Effect]:
        fx: list[Effect] = []

        def make_room(w: Waiter) -> bool:
            fx.extend(self._make_room(w, now))
            return w.lease_id in self.rooms

        def in_flight(w: Waiter) -> bool:
            room = self.rooms.get(w.lease_id)
            return room is not None and bool(room.pending)

        res = admission_pass(self.ledger, self.queue, self.policy, now, make_room, in_flight)
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
        if room is not None:
            for st in room.plan.steps:
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

    # -- making room ---------------------------------------------------------------------------
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
            if self._noplan_said.get(w.lease_id) != p.reason:
                self._noplan_said[w.lease_id] = p.reason
                return [Note(w.lease_id, "wait", f"{lease.engine} waits: {p.reason}")]
            return []
        if not p.steps:
            return []
        self._noplan_said.pop(w.lease_id, None)
        self.rooms[w.lease_id] = Room(p, frozenset(w.need), {st.lease_id for st in p.steps}, now)
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
            if st.action is Action.LEND:
                fx += self._begin_lend(victim, st.cards[0], st.lend_bytes, now, reason)
            elif st.action is Action.PARK:
                fx += self._begin_park(victim, now, reason)
            else:
                fx += self._stop(victim, now, reason)
        return fx

    def _awaited(self, victim_id: str) -> bool:
        """Does room being made for a waiter depend on this victim's step?"""
        return any(victim_id in r.pending for r in self.rooms.values())

    def _step_done(self, victim_id: str) -> bool:
        """Mark the victim's step done in whichever room waits on it; False if none does."""
        found = False
        for room in self.rooms.values():
            if victim_id in room.pending:
                room.pending.discard(victim_id)
                found = True
        return found

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

    # -- actions -------------------------------------------------------------------------------
    def _begin_park(self, lease: Lease, now: float, reason: str) -> list[Effect]:
        seq = next(self._seq)
        fx: list[Effect] = [Instruct(lease.id, Op.PARK, tuple(lease.shares), seq, reason=reason)]
        for pci, sh in lease.shares.items():
            self.ledger.move(lease.id, pci, S.PARKING, now, parked_bytes=counted_bytes(sh))
            self.deadlines[(lease.id, pci, Op.PARK)] = now + self.policy.release_grace_s
        if lease.caps.park is ParkMechanism.CHECKPOINT:
            self.counters.checkpoints += 1
        else:
            self.counters.parks += 1
        fx.append(Note(lease.id, "park", f"{lease.engine} parks by {lease.caps.park} ({reason})"))
        return fx

    def _begin_lend(self, lease: Lease, pci: str, n: int, now: float, reason: str) -> list[Effect]:
        self.ledger.move(lease.id, pci, S.LENDING, now, lent_bytes=n)
        self.deadlines[(lease.id, pci, Op.LEND)] = now + self.policy.release_grace_s
        self.counters.lends += 1
        return [Instruct(lease.id, Op.LEND, (pci,), next(self._seq), {pci: n}, reason=reason),
                Note(lease.id, "lend", f"{lease.engine} lends {format_size(n)} on {self._name(pci)} "
                     f"({reason})", {"card": pci, "bytes": n})]

    def _stop(self, lease: Lease, now: float, reason: str) -> list[Effect]:
        """Drain: every live share -> draining, and tell the run to stop its engine."""
        fx: list[Effect] = []
        moved = False
        for pci, sh in lease.shares.items():
            if sh.state in LIVE_STATES and sh.state is not S.DRAINING:
                self.ledger.move(lease.id, pci, S.DRAINING, now, **_ending(sh))
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
                                  reason=reason))
            fx.append(Note(lease.id, "drain", f"{lease.engine} drains ({reason})"))
        return fx

    def _fallback(self, lease: Lease, now: float, why: str) -> list[Effect]:
        """Rule 4: a park or lend that did not free the memory falls back to a drain."""
        self.counters.fallbacks_to_drain += 1
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

    # -- helpers -------------------------------------------------------------------------------
    def _watch(self, lease: Lease, pci: str, until: Until, max_use: int, now: float,
               within_s: float) -> Watch:
        return Watch(lease.id, pci, until, max_use, now, now + within_s)

    def _max_residual(self, lease: Lease, pci: str) -> int:
        """The most a parked share may leave on the card and still count as parked."""
        return max_residual(lease, pci, self.policy.hook_residual_guess_bytes)

    def _drop(self, lease_id: str) -> None:
        self.ledger.drop_lease(lease_id)
        self.queue.remove(lease_id)
        self.growth.forget(lease_id)
        self.wake_wanted.discard(lease_id)
        self._noplan_said.pop(lease_id, None)
        for key in [k for k in self.deadlines if k[0] == lease_id]:
            del self.deadlines[key]

    def _name(self, pci: str) -> str:
        c = self.ledger.cards.get(pci)
        return c.name if c else pci

    def _bytes_on(self, lease: Lease, attr: str) -> str:
        return ", ".join(f"{self._name(p)} {format_size(getattr(sh, attr))}"
                         for p, sh in lease.shares.items())

    def why_waiting(self, lease_id: str) -> str | None:
        """Why a waiter is still waiting, in words: room being made, or what the ladder last
        found in the way (``None`` before the first attempt)."""
        room = self.rooms.get(lease_id)
        if room is not None and room.pending:
            return f"room being made by {room.plan.rung}"
        return self._noplan_said.get(lease_id)

    def find(self, key: str) -> Lease:
        """A lease by id, or the one lease of an engine by name. Raises ``KeyError`` for none and
        ``ValueError`` when several leases run that engine."""
        if key in self.ledger.leases:
            return self.ledger.leases[key]
        named = [le for le in self.ledger.leases.values() if le.engine == key]
        if not named:
            raise KeyError(f"no lease or engine named {key!r}")
        if len(named) > 1:
            raise ValueError(f"{len(named)} leases run engine {key!r} "
                             f"({', '.join(sorted(le.id for le in named))}); name the lease")
        return named[0]
