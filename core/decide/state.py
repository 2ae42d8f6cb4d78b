"""The scheduler's state and the small lookups every part of it shares.

Source: STYLE.md "one run loop owns the state". :class:`SchedulerState` holds what the
scheduler's parts (:mod:`.actions`, :mod:`.rooms`, :mod:`.deadlines`, :mod:`.scheduler`) read and
change: the ledger, the queue, the rooms being made, the deadlines. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .admission import Policy, Queue
from .causes import jobs_words
from .effects import Until, Watch
from .ladder import Plan, SwapLog
from .ledger import Ledger, max_residual
from .measures import Counters, GrowthMeter
from .model import Lease, ShareState
from .units import format_duration, format_size

S = ShareState

__all__ = ["SchedulerState", "Room"]


@dataclass
class Room:
    """Room being made for one waiter: the plan, the waiter's cards, and the victims (lease
    ids) whose steps the driver has not confirmed yet. ``contested``: the victims that had work
    in flight when the plan was made (only those swaps count for the juggle guard).
    ``fell_back``: those whose step fell back to a drain (rule 4)."""

    plan: Plan
    cards: frozenset[str]
    pending: set[str]
    since: float
    contested: frozenset[str] = frozenset()
    fell_back: set[str] = field(default_factory=set)


class SchedulerState:
    """The state of :class:`~.scheduler.Scheduler` and the lookups its parts share. Deadlines
    are keyed ``(lease id, pci, op)`` and hold a time in seconds."""

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
        self._noplan_said: dict[str, tuple[str, bool]] = {}   # waiter -> (reason, lasting)
        self._behind: dict[str, str] = {}      # waiter -> the earlier waiter holding its cards
        #: Grant only on a driver read taken in the same step (rule 1); the broker reads the
        #: cards a ReadCards effect names and observes them at once.
        self.read_before_grant = True
        self._over: set[tuple[str, str]] = set()

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
        return self.wait_cause(lease_id)[0]

    def wait_cause(self, lease_id: str) -> tuple[str | None, bool]:
        """``(why, lasting)`` for a waiter: room being made (naming each victim and the
        requests it finishes first), the earlier waiter it queues behind, or what the ladder
        last found in the way; ``lasting`` when nothing under way could change that (issue 12
        case 6). ``(None, False)`` when it is not waiting or before the first attempt."""
        if lease_id not in self.queue:
            return None, False
        room = self.rooms.get(lease_id)
        if room is not None and room.pending:
            parts = []
            for st in room.plan.steps:
                if st.lease_id not in room.pending:
                    continue
                victim = self.ledger.leases.get(st.lease_id)
                jobs = victim.in_flight if victim is not None else 0
                part = f"{st.action} {st.engine}"
                if jobs and st.quiet_s:
                    part += (f" once its {jobs_words(jobs)} end (at most "
                             f"{format_duration(st.quiet_s)})")
                parts.append(part)
            return f"room being made by {room.plan.rung}: " + ", ".join(parts), False
        ahead = self._behind.get(lease_id)
        if ahead is not None and ahead in self.ledger.leases:
            return f"queued behind {self.ledger.leases[ahead].engine} for the same card", False
        said = self._noplan_said.get(lease_id)
        return (said[0], said[1]) if said else (None, False)

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
