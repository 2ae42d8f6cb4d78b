"""What the scheduler returns and what it takes from a driver read: effects and card reads.

Source: STYLE.md "effects as data"; seed 002 rule 1 (only a driver read confirms memory moved).
The broker (``berth.daemon.broker``) and the policy simulator (``bench/policy``) carry these out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .instruction import Instruction
from .ladder import Rung

__all__ = ["Effect", "Granted", "Instruct", "Watch", "Rejected", "Ended", "Note", "CardRead", "Until",
           "ReadCards"]


class Until(enum.StrEnum):
    """What a driver confirmation waits for: the use down to a limit after a park or a lend, or
    the lease's processes gone from the card."""

    PARKED = "parked"
    LENT = "lent"
    FREED = "freed"


# -- effects ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    lease_id: str


@dataclass(frozen=True)
class Granted(Effect):
    """The lease's shares are active: its run may start the engine. ``cards``: {pci: bytes}."""

    cards: dict[str, int]
    rung: str = Rung.FIT.value


@dataclass(frozen=True)
class Instruct(Instruction, Effect):
    """Tell the run holding ``lease_id`` to act: an :class:`~.instruction.Instruction`
    addressed to a lease (what berthd sends is its :meth:`~.instruction.Instruction.to_wire`).
    Built as ``Instruct(lease_id, op, cards, seq, bytes, reason=..., quiet_s=...)``."""


@dataclass(frozen=True)
class Watch(Effect):
    """Start a driver confirmation for one share: ``until`` is ``parked`` (use down to at most
    ``max_use_bytes``), ``lent`` (likewise) or ``freed`` (the lease's processes gone from the
    card). ``since`` is the event time the read must follow; ``deadline`` when to stop."""

    pci: str
    until: Until
    max_use_bytes: int
    since: float
    deadline: float


@dataclass(frozen=True)
class ReadCards(Effect):
    """Read these cards now, inside the single writer, and ``observe`` the read: a waiter fits
    by the last read, but a grant is decided only on a read taken in its own step (seed 002
    rule 1; STYLE.md "a read that gates a mutation"; issue 12 case 1). ``lease_id`` is empty."""

    cards: tuple[str, ...]


@dataclass(frozen=True)
class Rejected(Effect):
    reason: str


@dataclass(frozen=True)
class Ended(Effect):
    """Every share of the lease is freed (or it was withdrawn); it is gone from the ledger."""

    reason: str = ""


@dataclass(frozen=True)
class Note(Effect):
    """A line of the timeline: ``kind`` like ``park``, ``fallback``, ``lease.unparked``."""

    kind: str
    text: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CardRead:
    """One driver read of one card, mapped to leases by the broker. Bytes. ``used`` maps lease
    id to that lease's use on the card (``None``: the driver cannot say per process).
    ``stowaways`` maps the PID of each process outside any lease to its bytes, and
    ``stowaway_who`` the same PIDs to ``(program, user)`` as the process table names them
    (issue 37: a culprit named whole), where it could be read."""

    free_bytes: int
    stowaway_bytes: int = 0
    stowaways: dict[int, int] = field(default_factory=dict)
    stowaway_who: dict[int, tuple[str, str]] = field(default_factory=dict)
    used: dict[str, int | None] = field(default_factory=dict)
    total_bytes: int | None = None
