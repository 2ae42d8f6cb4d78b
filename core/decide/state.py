"""The scheduler's state and the small lookups every part of it shares.

Source: STYLE.md "one run loop owns the state" and "a scheduler type with its helpers in plain
functions over its state" (llama-swap's ``fifo.go``). :class:`State` holds what the scheduler's
modules (:mod:`.actions`, :mod:`.rooms`, :mod:`.restarts`, :mod:`.deadlines`, :mod:`.reports`)
read and change: the ledger, the queue, the rooms being made, the deadlines. The functions here
are the lookups they share. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .admission import Policy, Queue
from .causes import jobs_words
from .ladder import Plan
from .ledger import Ledger
from .ledger import max_residual as _max_residual
from .measures import Counters, GrowthMeter
from .model import Lease
from .turns import SwapLog
from .units import format_duration, format_size

__all__ = ["State", "Room", "Moving", "awaited", "step_done", "residual_limit", "drop", "card_name",
           "bytes_on", "wait_cause", "find"]


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


@dataclass(frozen=True)
class Moving:
    """A move under way (issue 35: the board shows it while it happens): the lease's cards
    ``src`` (PCI addresses) before it, the card ``dst`` its plan moves it to, ``why`` in words,
    ``since`` when it began (seconds, broker's clock), ``how`` ``"restore"`` (a checkpoint
    restored there: its wake is placed as a grant is, so the card it lands on is said when it
    wakes) or ``"restart"`` (a drain whose run asks for a card again at once: the entry goes
    with the lease, and the run's drained entry says the rest, :mod:`berth.daemon.drained`)."""

    src: tuple[str, ...]
    dst: str
    why: str
    since: float
    how: str = "restore"


class State:
    """What the scheduler owns. ``deadlines`` are keyed ``(lease id, pci, op)`` and hold a time
    in seconds; ``noplan_said`` is the last :class:`~.ladder.NoPlan` said per waiter
    (``(reason, lasting)``), ``behind`` the earlier waiter holding a waiter's cards, ``over``
    the ``(lease, pci)`` shares reported over their lease."""

    def __init__(self, policy: Policy, ledger: Ledger | None = None, first_seq: int = 1):
        self.policy = policy
        self.ledger = ledger or Ledger()
        self.queue = Queue()
        self.rooms: dict[str, Room] = {}
        #: rooms finished in this admission pass that did not make their waiter fit: a waiter
        #: that ranks before it and was granted on those cards took them (issue 24)
        self.finished: dict[str, Room] = {}
        self.swaps = SwapLog()
        self.counters = Counters()
        self.growth = GrowthMeter()
        self.deadlines: dict[tuple[str, str, str], float] = {}
        self.wake_wanted: set[str] = set()
        self.noplan_said: dict[str, tuple[str, bool]] = {}
        self.behind: dict[str, str] = {}
        self.over: set[tuple[str, str]] = set()
        #: why a waiter's movable shares stand where they do, in words (issue 25; said at
        #: its grant)
        self.placed: dict[str, str] = {}
        #: when a turn that keeps a waiter's room from it ends, by waiter (issue 34: an idle
        #: holder yields λ·rent after its last answer, not at the next driver read)
        self.recheck: dict[str, float] = {}
        #: moves by checkpoint and restore under way, by lease id, until its wake ends
        self.moving: dict[str, Moving] = {}
        #: Grant only on a driver read taken in the same step (rule 1); the broker reads the
        #: cards a ReadCards effect names and observes them at once.
        self.read_before_grant = True
        self._seq = itertools.count(first_seq)

    def next_seq(self) -> int:
        """The next instruction number (they keep growing, across restarts too)."""
        return next(self._seq)


def awaited(st: State, victim_id: str) -> bool:
    """Does room being made for a waiter depend on this victim's step?"""
    return any(victim_id in r.pending for r in st.rooms.values())


def step_done(st: State, victim_id: str) -> bool:
    """Mark the victim's step done in whichever room waits on it; False if none does."""
    found = False
    for room in st.rooms.values():
        if victim_id in room.pending:
            room.pending.discard(victim_id)
            found = True
    return found


def residual_limit(st: State, lease: Lease, pci: str) -> int:
    """The most (bytes) a parked share may leave on the card and still count as parked."""
    return _max_residual(lease, pci, st.policy.hook_residual_guess_bytes)


def drop(st: State, lease_id: str) -> None:
    """Forget an ended lease everywhere (its shares must count 0)."""
    st.ledger.drop_lease(lease_id)
    st.queue.remove(lease_id)
    st.growth.forget(lease_id)
    st.wake_wanted.discard(lease_id)
    st.noplan_said.pop(lease_id, None)
    st.placed.pop(lease_id, None)
    st.recheck.pop(lease_id, None)
    st.moving.pop(lease_id, None)
    for key in [k for k in st.deadlines if k[0] == lease_id]:
        del st.deadlines[key]


def card_name(st: State, pci: str) -> str:
    c = st.ledger.cards.get(pci)
    return c.name if c else pci


def bytes_on(st: State, lease: Lease, attr: str) -> str:
    """``"gpu0 1.0GiB, gpu1 2.0GiB"``: one share field in bytes per card, in words."""
    return ", ".join(f"{card_name(st, p)} {format_size(getattr(sh, attr))}"
                     for p, sh in lease.shares.items())


def wait_cause(st: State, lease_id: str) -> tuple[str | None, bool]:
    """See :meth:`~.scheduler.Scheduler.wait_cause`."""
    if lease_id not in st.queue:
        return None, False
    room = st.rooms.get(lease_id)
    if room is not None and room.pending:
        parts = []
        for step in room.plan.steps:
            if step.lease_id not in room.pending:
                continue
            victim = st.ledger.leases.get(step.lease_id)
            jobs = victim.in_flight if victim is not None else 0
            if victim is not None and step.fence_at is not None:
                # Fenced (issue 34): the park waits for what runs, not for the newer requests
                # its front holds for after the wake.
                jobs -= victim.held_jobs
            part = f"{step.action} {step.engine}"
            if jobs and step.quiet_s:
                part += (f" once its {jobs_words(jobs)} end (at most "
                         f"{format_duration(step.quiet_s)})")
            parts.append(part)
        return f"room being made by {room.plan.rung}: " + ", ".join(parts), False
    ahead = st.behind.get(lease_id)
    if ahead is not None and ahead in st.ledger.leases:
        said = f"queued behind {st.ledger.leases[ahead].engine} for the same card"
        # Issue 37: every wait names what holds the memory. The lease ahead's own cause does
        # (one level: a chain of waiters is named by its head, whose cause names the holders).
        head_why = None if ahead in st.behind else wait_cause(st, ahead)[0]
        if head_why:
            said += f" ({st.ledger.leases[ahead].engine}: {head_why})"
        return said, False
    said = st.noplan_said.get(lease_id)
    return (said[0], said[1]) if said else (None, False)


def find(st: State, key: str) -> Lease:
    """See :meth:`~.scheduler.Scheduler.find`."""
    if key in st.ledger.leases:
        return st.ledger.leases[key]
    named = [le for le in st.ledger.leases.values() if le.engine == key]
    if not named:
        raise KeyError(f"no lease or engine named {key!r}")
    if len(named) > 1:
        raise ValueError(f"{len(named)} leases run engine {key!r} "
                         f"({', '.join(sorted(le.id for le in named))}); name the lease")
    return named[0]
