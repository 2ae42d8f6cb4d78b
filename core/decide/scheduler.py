"""The broker's decisions as a pure state machine: events in, effects out.

This is the "scheduler with an effects table" of STYLE.md (after llama-swap's router design): it
performs no I/O and reads no clock. ``berth.daemon.broker`` feeds it events from the control API, the
runs, the driver and a timer, and carries out the :class:`Effect` values it returns; the policy
simulator (``bench/policy``) feeds it the same events in virtual time.

One class, :class:`Scheduler`, owns the :class:`~.state.State`; its event methods call plain
functions over that state, one module per job (as llama-swap keeps one scheduler type and its
helpers in ``fifo.go``):

- :mod:`.actions`: the moves on one lease (park, lend, drain, fall back, ask for a wake or a
  return), every share move through :meth:`~.ledger.Ledger.move`;
- :mod:`.rooms`: admitting (the admission pass) and making room (the ladder's plan carried out);
- :mod:`.reports`: what the driver and the runs say (``observe``, ``confirmed``, ``report``);
- :mod:`.restarts`: a holder's exit, the restart hold, a lease taken back after berthd restarts;
- :mod:`.deadlines`: ``release_grace`` (park, lend -> drain), ``wake_limit`` (wake, return ->
  stop), a restart hold that runs out.

Events (methods) and what they do:

- :meth:`request` a lease; :meth:`withdraw` one still waiting.
- :meth:`extend` a reservation before growing; :meth:`unextend` (``Rooms``) withdraws the request.
- :meth:`observe` a driver read: free bytes, stowaways, each holder's use. Detects a parked share
  that loaded again (``lease.unparked``) and a growth-bound holder past its reservation.
- :meth:`confirmed`: the driver confirmation helper saw memory leave (``parked``, ``lent``) or
  free (``freed``). Only this moves a share to ``parked``, ``lent`` or ``freed`` (rule 1).
- :meth:`report`: a run says a wake, return, park, lend or drain finished, or failed (numbered
  steps in :func:`.reports.report`).
- :meth:`exited`: the holder's process is gone.
- :meth:`wake`: a front holds a write for a parked engine.
- :meth:`operator`: park, wake, drain, hold, release-hold.
- :meth:`tick`: deadlines.

Effects: :class:`Granted`, :class:`Instruct` (to the run that holds the lease), :class:`Watch`
(start a driver confirmation), :class:`Rejected`, :class:`Ended`, :class:`Note` (the timeline).
"""

from __future__ import annotations

import enum

from . import deadlines, reports, restarts, rooms
from .actions import begin_park, stop, want_resume
from .admission import Policy, Queue, Waiter, WaitKind
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
from .ladder import ram_cost
from .ledger import Ledger
from .measures import Counters, GrowthMeter
from .model import Lease, Op, ShareState
from .placement import Ask, movable_of, place, shares_for
from .state import Room, State, card_name, find, wait_cause
from .turns import SwapLog
from .units import format_size

S = ShareState

__all__ = ["Scheduler", "Effect", "Granted", "Instruct", "Watch", "Rejected", "Ended", "Note",
           "CardRead", "Room", "Until", "Hold", "ReadCards"]


class Hold(enum.StrEnum):
    """The operator's hold on a lease (no ladder may displace it), beside :class:`Op`'s park,
    wake and drain in :meth:`Scheduler.operator`."""

    HOLD = "hold"
    RELEASE = "release-hold"


class Scheduler:
    """The single writer of lease state. Not thread-safe: call it from one task.

    Every event method takes ``now`` (seconds) and returns the list of effects to carry out, in
    order. Raises ``KeyError`` for an unknown lease id and ``ValueError`` for a request that
    makes no sense (both change nothing). ``first_seq``: the first instruction number.
    """

    def __init__(self, policy: Policy, ledger: Ledger | None = None, first_seq: int = 1):
        self.state = State(policy, ledger, first_seq)

    # What the broker, the board and the simulator read: the state's own objects.
    @property
    def policy(self) -> Policy:
        return self.state.policy

    @property
    def ledger(self) -> Ledger:
        return self.state.ledger

    @property
    def queue(self) -> Queue:
        return self.state.queue

    @property
    def counters(self) -> Counters:
        return self.state.counters

    @property
    def growth(self) -> GrowthMeter:
        return self.state.growth

    @property
    def swaps(self) -> SwapLog:
        return self.state.swaps

    @property
    def deadlines(self) -> dict[tuple[str, str, str], float]:
        return self.state.deadlines

    # -- leases asked for and given back --------------------------------------------------------
    def place(self, lease: Lease, asks: list[Ask], held: dict[str, int | None]) -> None:
        """Put the shares ``asks`` names on cards for a new lease, before :meth:`request`: the
        choice (:func:`.placement.place`) is made here, inside the single writer, on the ledger
        as it is now. ``held``: bytes an adopted process holds per card (``{}``: none). Fills
        ``lease.shares`` and ``lease.need_bytes``; raises
        :class:`~.placement.PlacementError` naming the share (nothing changes). A share that
        names no card is movable: the admission pass places it anew until it is granted
        (issue 25)."""
        cards = place(self.ledger, asks, held)
        shares, need = shares_for(asks, cards, held)
        lease.shares.update(shares)
        lease.need_bytes.update(need)
        lease.movable = movable_of(asks, cards, held)

    def request(self, lease: Lease, now: float, client: str | None = None,
                asked_at: float | None = None) -> list[Effect]:
        """Queue a new lease (all shares ``waiting``). ``client``: the client key of a request
        it asks for, which arrived at ``asked_at`` (default ``now``): a drained run asks again
        for a request its front holds, and an idle holder whose last answer went to that client
        yields at once, as for :meth:`wake` (issue 34). Raises ``ValueError``/``KeyError``."""
        if lease.id in self.ledger.leases:
            raise ValueError(f"lease {lease.id}: already known")
        if not lease.shares:
            raise ValueError(f"lease {lease.id}: asks for no card")
        if any(sh.state is not S.WAITING for sh in lease.shares.values()):
            raise ValueError(f"lease {lease.id}: a new lease's shares must be waiting")
        lease.requested_at = now
        lease.last_used_at = now
        self.ledger.add_lease(lease)
        if client is not None:
            reports.asked(self.state, lease, client, now if asked_at is None else asked_at)
        self.queue.push(Waiter(lease.id, WaitKind.GRANT, lease.priority, now, {}))
        fx: list[Effect] = [Note(lease.id, "request", f"{lease.engine} asks for "
                                 + ", ".join(_asked(self.state, lease, p)
                                             for p in lease.shares))]
        return fx + rooms.admit(self.state, now)

    def withdraw(self, lease_id: str, now: float, reason: str = "withdrawn") -> list[Effect]:
        """Take back a lease that is still waiting. A granted lease must be released instead."""
        return rooms.withdraw(self.state, lease_id, now, reason)

    def unextend(self, lease_id: str, now: float, reason: str = "withdrawn") -> list[Effect]:
        """The holder no longer wants the room it asked for with :meth:`extend` (its prompt got
        a 503, its client went away, or the asker's process is gone): take the request out of
        the queue and drop the room being made for it, so the ladder never makes room later for
        nobody. A park already instructed goes on (only the driver settles a park); lends
        already confirmed grow back. No request of that kind: no effects. Raises ``KeyError``
        for an unknown lease."""
        return rooms.unextend(self.state, lease_id, now, reason)

    def exited(self, lease_id: str, now: float, final: bool = False) -> list[Effect]:
        """The lease's process is gone. Live shares become ``released`` (they count until a
        driver read shows them free); a waiting lease is withdrawn.

        Unless ``final`` (a release, a reported drain, a restart hold that ran out): a lease
        with ``restart_grace_s`` whose shares are all active and that was asked for nothing
        keeps its room while its supervisor restarts the process: its PID is cleared for
        ``attach`` and nothing else changes until ``restarting_until`` (issue 12 case 2)."""
        return restarts.exited(self.state, lease_id, now, final)

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
        return restarts.adopt(self.state, lease, now, waiting, since, use or {})

    # -- what the holder's run and front say ------------------------------------------------------
    def attach(self, lease_id: str, pid: int, start_time: float, now: float) -> list[Effect]:
        """Record the holder's process identity (PID and start time)."""
        lease = self.ledger.leases[lease_id]
        lease.pid, lease.start_time = pid, start_time
        if lease.restarting_until is not None:
            lease.restarting_until = None
            return [Note(lease_id, "attach", f"{lease.engine} restarted as pid {pid}; it "
                                             f"keeps its room")]
        return [Note(lease_id, "attach", f"{lease.engine} runs as pid {pid}")]

    def jobs(self, lease_id: str, in_flight: int, now: float, oldest_at: float | None = None,
             served: int | None = None, client: str | None = None,
             answered_client: str | None = None,
             answered_at: float | None = None, held: int | None = None,
             oldest_held_at: float | None = None) -> list[Effect]:
        """The holder's front forwards ``in_flight`` requests now (its run reports each change).
        A holder that goes idle yields to anyone waiting once its idle spell outlasts a switch
        back (rent or buy, issue 24), so the admission pass runs then; a busy one's park or
        drain waits for its jobs, up to its ``max_job`` (issue 12 case 4). ``oldest_at``: when
        the oldest of those requests arrived (seconds, the scheduler's clock; ``None`` when the
        front does not say). ``served``: the model requests its front has started during this
        lease (``None``: not said); a count that moved since the last report is a request served
        between two in-flight samples, so its turn's first request has come and its idle spell
        starts now (a count that went back is a new run's front counting from 0).
        ``client``: the client key of the oldest of those requests; ``answered_client`` /
        ``answered_at``: the client key of the last answer the front delivered and when it
        ended (``None``: not said): the forecast of whether a request comes for it within a
        switch back learns from them (issue 34, :mod:`.demand`). ``held``: how many of those
        requests the front holds, not yet forwarded (its slots are full; ``None``: not said),
        and ``oldest_held_at`` when the oldest of them arrived: a holder that holds requests is
        parked fenced at once (issue 34, the fence: :attr:`~.model.Lease.held_jobs`). Raises
        ``ValueError`` for a negative count."""
        return reports.jobs(self.state, lease_id, in_flight, now, oldest_at, served, client,
                            answered_client, answered_at, held, oldest_held_at)

    def touch(self, lease_id: str, now: float) -> list[Effect]:
        """The engine served a request (for least-recently-used victim order)."""
        self.ledger.leases[lease_id].last_used_at = now
        return []

    def ready(self, lease_id: str, now: float) -> list[Effect]:
        """The engine answered after its grant: its minimum turn starts now, not at the grant
        (a cold load longer than the minimum turn must not lose the card before it serves)."""
        lease = self.ledger.leases[lease_id]
        if lease.ready_at is None or (lease.granted_at is not None
                                      and lease.ready_at < lease.granted_at):
            lease.ready_at = now
            if lease.granted_at is not None:
                lease.switch_cost_s = now - lease.granted_at
            return [Note(lease_id, "ready", f"{lease.engine} is serving")] \
                + rooms.admit(self.state, now)
        return []

    def report(self, lease_id: str, op: str, ok: bool, now: float,
               detail: str = "") -> list[Effect]:
        """A run's word on an instruction: success of a park or lend starts the driver's
        confirmation (rule 1), a failure falls back to a drain at once (rule 4), a drain report
        means the engine process has exited. The steps are numbered in
        :func:`.reports.report`. Raises ``ValueError`` for an unknown ``op``."""
        return reports.report(self.state, lease_id, op, ok, now, detail)

    def wake(self, lease_id: str, now: float, client: str | None = None,
             asked_at: float | None = None) -> list[Effect]:
        """A front holds a write for this lease: queue its resume if it is parked (or once its
        park settles). Waking an active lease does nothing. ``client``: the client key of the
        request that asks, which arrived at ``asked_at`` (default ``now``): an idle holder
        whose last answer went to that client yields at once (issue 34, :mod:`.demand`)."""
        lease = self.ledger.leases[lease_id]
        reports.asked(self.state, lease, client, now if asked_at is None else asked_at)
        lease.last_used_at = now
        sts = lease.states()
        if S.PARKED in sts:
            return want_resume(self.state, lease, now) + rooms.admit(self.state, now)
        if S.PARKING in sts:
            self.state.wake_wanted.add(lease_id)
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
        self.state.wake_wanted.discard(lease_id)
        w = self.queue.get(lease_id)
        if w is None or w.kind is not WaitKind.RESUME:
            return []
        self.queue.remove(lease_id)
        fx = rooms.cancel_room(self.state, lease_id, now)
        fx.append(Note(lease_id, "wake.off", f"{lease.engine}: the requests that asked for the "
                                              f"wake have gone; it stays parked"))
        return fx + rooms.admit(self.state, now)

    def extend(self, lease_id: str, pci: str, n_bytes: int, now: float, client: str | None = None,
               asked_at: float | None = None, to_bytes: int | None = None) -> list[Effect]:
        """The holder asks for ``n_bytes`` more on ``pci`` *before* it grows (issue 13: ComfyUI
        before a prompt whose model files pass its reservation). Queued as seed 000's extension
        event, so the ladder makes room first; at most the share's size, and with ``to_bytes``
        (the reservation needed in all) only what the reservation lacks of it: the holder's
        copy may be behind a growth a driver read extended here. ``client`` and ``asked_at``:
        as for :meth:`wake`. Raises ``KeyError`` for a card the lease has no share on,
        ``ValueError`` unless that share is active."""
        lease = self.ledger.leases[lease_id]
        sh = lease.shares.get(pci)
        if sh is None:
            raise KeyError(f"lease {lease_id!r} has no share on {pci}")
        if sh.state is not S.ACTIVE:
            raise ValueError(f"{lease.engine}'s share on {card_name(self.state, pci)} is "
                             f"{sh.state.value}; only an active share extends")
        most = sh.size_bytes if to_bytes is None else min(sh.size_bytes, int(to_bytes))
        n = min(int(n_bytes), most - sh.reserved_bytes)
        if n <= 0 or lease_id in self.queue:
            return []
        reports.asked(self.state, lease, client, now if asked_at is None else asked_at)
        self.queue.push(Waiter(lease_id, WaitKind.EXTEND, lease.priority, now, {pci: n}))
        return [Note(lease_id, "extend.asked", f"{lease.engine} asks for {format_size(n)} more "
                     f"on {card_name(self.state, pci)} before it grows")] \
            + rooms.admit(self.state, now)

    # -- what the driver says, and time ---------------------------------------------------------
    def observe(self, reads: dict[str, CardRead], now: float) -> list[Effect]:
        """Take in a driver read per card (PCI address -> :class:`CardRead`)."""
        return reports.observe(self.state, reads, now)

    def confirmed(self, lease_id: str, pci: str, what: str, now: float,
                  use_bytes: int | None = None) -> list[Effect]:
        """A driver read taken after the event showed the memory left (``parked``, ``lent``) or
        free (``freed``). ``use_bytes`` is the holder's measured use then (the residual of a
        park). A confirmation that no longer matches the share's state is ignored."""
        return reports.confirmed(self.state, lease_id, pci, what, now, use_bytes)

    def tick(self, now: float) -> list[Effect]:
        """Act on deadlines that have passed, then run an admission pass."""
        return deadlines.tick(self.state, now)

    def next_due(self) -> float | None:
        """When :meth:`tick` next has work (seconds, the scheduler's clock): the earliest
        deadline, or the end of a turn that keeps a waiter waiting (issue 34); ``None``: none."""
        return deadlines.next_due(self.state)

    # -- the operator ----------------------------------------------------------------------------
    def operator(self, op: str, lease_id: str, now: float) -> list[Effect]:
        """Operator actions: ``park``, ``wake``, ``drain``, ``hold``, ``release-hold``.
        Raises ``ValueError`` when the lease cannot do it (a park needs a declared park and a
        front; rule 3)."""
        lease = self.ledger.leases[lease_id]
        if op in (Hold.HOLD, Hold.RELEASE):
            return _hold(self.state, lease, op == Hold.HOLD, now)
        if op == Op.WAKE:
            return self.wake(lease_id, now)
        if op == Op.DRAIN and lease.is_waiting():
            return self.withdraw(lease_id, now, "drained by the operator while waiting")
        if op in (Op.PARK, Op.DRAIN):
            return _park_or_drain(self.state, lease, op, now)
        raise ValueError(f"op: expected park, wake, drain, hold or release-hold, got {op!r}")

    # -- lookups ---------------------------------------------------------------------------------
    def why_waiting(self, lease_id: str) -> str | None:
        """Why a waiter is still waiting, in words: room being made, or what the ladder last
        found in the way (``None`` before the first attempt)."""
        return self.wait_cause(lease_id)[0]

    def wait_cause(self, lease_id: str) -> tuple[str | None, bool]:
        """``(why, lasting)`` for a waiter: room being made (naming each victim and the
        requests it finishes first), the earlier waiter it queues behind, or what the ladder
        last found in the way; ``lasting`` when nothing under way could change that (issue 12
        case 6). ``(None, False)`` when it is not waiting or before the first attempt."""
        return wait_cause(self.state, lease_id)

    def find(self, key: str) -> Lease:
        """A lease by id, or the one lease of an engine by name. Raises ``KeyError`` for none and
        ``ValueError`` when several leases run that engine."""
        return find(self.state, key)


def _asked(st: State, lease: Lease, pci: str) -> str:
    """One share of a request in words: its card, or its size on any card."""
    if pci not in lease.movable:
        return card_name(st, pci)
    sh = lease.shares[pci]
    return "a whole card" if sh.whole_card else f"{format_size(sh.size_bytes)} on any card"


def _park_or_drain(st: State, lease: Lease, op: Op, now: float) -> list[Effect]:
    """The operator's park or drain of a lease that holds its card (a hold is overridden, and
    said so). Raises ``ValueError`` for a park the lease cannot do (rule 3)."""
    if op == Op.DRAIN:
        return _overrides(lease, "drain") + stop(st, lease, now, "operator") + rooms.admit(st, now)
    sts = lease.states()
    if lease.caps.can_park() and sts <= {S.PARKED, S.PARKING}:
        # The wish already holds: say so, as a wake of an active engine does.
        return [Note(lease.id, "park.none", f"{lease.engine} is already "
                     f"{', '.join(sorted(s.value for s in sts))}; nothing to park")]
    _check_parkable(lease)
    # The ladder never plans a park the host RAM budget cannot hold; nor may the operator's
    # (before, `berth park` said "parks by checkpoint" and the mechanism then refused it, and
    # the engine was stopped instead).
    ram, need = st.ledger.ram_available_bytes(lease.id), ram_cost(lease, st.policy)
    if ram is not None and need > ram:
        raise ValueError(f"lease {lease.id}: {lease.engine} cannot park now: its park would put "
                         f"{format_size(need)} in host RAM and the budget ([policy] ram_budget) "
                         f"has {format_size(max(0, ram))} left beside the parked engines; "
                         f"`berth drain {lease.engine}` stops it instead")
    return _overrides(lease, "park") + begin_park(st, lease, now, "operator") \
        + rooms.admit(st, now)


def _hold(st: State, lease: Lease, held: bool, now: float) -> list[Effect]:
    """An operator's hold (the lease is never displaced for a waiter) or its release, which
    lets the waiters it kept out try again."""
    if lease.held == held:
        # The wish already holds: say so, as a park of a parked engine does, rather than
        # "no longer held" for a hold that was never there.
        if held:
            return [Note(lease.id, "hold", f"{lease.engine} is already held; nothing to hold")]
        return [Note(lease.id, "hold", f"{lease.engine} is not held; nothing to release")]
    lease.held = held
    if held:
        return [Note(lease.id, "hold", f"{lease.engine} held by the operator")]
    return [Note(lease.id, "hold", f"{lease.engine} no longer held")] + rooms.admit(st, now)


def _overrides(lease: Lease, op: str) -> list[Effect]:
    """The note that an operator's park or drain overrides the lease's hold (a hold protects
    it from being displaced for a waiter, not from the operator): berthd's log, its timeline
    and the CLI's answer say so, with what stays. ``[]`` when it is not held."""
    if not lease.held:
        return []
    after = ("the hold stays: the engine is protected again once it wakes; `berth release-hold "
             f"{lease.engine}` ends it") if op == "park" else "the hold ends with the lease"
    return [Note(lease.id, "hold.override", f"{lease.engine} is held by the operator: this "
                 f"{op} overrides the hold ({after})")]


def _check_parkable(lease: Lease) -> None:
    """Raise ``ValueError`` unless the operator may park ``lease`` now (rule 3)."""
    if not lease.caps.can_park() and not lease.caps.drain:
        # An in-process host (ComfyUI's node): a drain would not stop it either (rule 6), so
        # the advice names what does free its memory (issue 37).
        raise ValueError(f"lease {lease.id}: {lease.engine} cannot park: "
                         f"{lease.caps.no_park or 'it registered without a park'}; it is an "
                         f"in-process host, which Berth never stops (`berth drain` would only "
                         f"refuse its work): restart {lease.engine} itself to free its memory")
    if not lease.caps.can_park():
        missing = "--park" if lease.caps.park is None else "--front"
        raise ValueError(f"lease {lease.id}: {lease.engine} cannot park: its run gave no "
                         f"{missing} (`berth run --front HOST:PORT --park "
                         f"checkpoint|hook` makes an engine parkable); `berth drain "
                         f"{lease.engine}` stops it instead")
    if not all(sh.state is S.ACTIVE for sh in lease.shares.values()):
        raise ValueError(f"lease {lease.id}: {lease.engine} can only park when every "
                         f"share is active; it is "
                         f"{', '.join(sorted(st.value for st in lease.states()))}")
