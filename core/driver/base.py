"""One driver interface for NVML and for simulated cards (rule 1: "the driver decides").

Source: seed 002 rule 1; reference/park-mechanisms.md "NVML for the driver read".

A backend implements :class:`Driver`: it lists cards, reads a card's memory, and reads the
processes on a card. Every failure is a :class:`DriverError`. :func:`confirm` is the
confirmation helper the broker uses after every release, park, checkpoint and lend: it returns
the first read *taken after the event* that shows the memory gone, polling with a short growing
back-off. It never takes an engine's word.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["DriverError", "CardInfo", "Reading", "Driver", "PidsGone", "UseAtMost", "BytesBack",
           "Event", "confirm", "UNKNOWN"]

#: Per-process use the driver cannot report (WDDM, some containers): never read as 0.
UNKNOWN = None


class DriverError(RuntimeError):
    """A driver read failed (no driver loaded, a card lost mid-read, a corrupt sim state).
    ``pci`` names the card when one was involved."""

    def __init__(self, message: str, pci: str | None = None):
        super().__init__(message)
        self.pci = pci


@dataclass(frozen=True)
class CardInfo:
    """A card as the driver reports it. Bytes. ``pci`` is normalised (``0000:05:00.0``);
    ``uuid`` as ``CUDA_VISIBLE_DEVICES`` takes it (``GPU-…``); ``model`` the product name."""

    pci: str
    uuid: str
    model: str
    total_bytes: int
    free_bytes: int
    index: int = 0


@dataclass(frozen=True)
class Reading:
    """One read of one card: ``free_bytes``, and ``processes`` mapping PID (in Berth's own PID
    namespace) to bytes, or to ``None`` when the driver cannot say per process. ``at`` is the
    reader's monotonic clock (seconds) when the read completed. ``processes_known`` is False when
    the driver could not list the card's processes at all (NVML ``NOT_SUPPORTED``): an empty
    ``processes`` then proves nothing, and only free bytes can confirm an event."""

    pci: str
    at: float
    free_bytes: int
    total_bytes: int
    processes: dict[int, int | None] = field(default_factory=dict)
    processes_known: bool = True

    def use_of(self, pids: set[int]) -> int | None:
        """Σ use of ``pids`` on the card: 0 if none is present, ``None`` if any is unknown (or
        the process list itself is unknown)."""
        if not self.processes_known:
            return None
        total = 0
        for pid in pids:
            if pid in self.processes:
                b = self.processes[pid]
                if b is None:
                    return None
                total += b
        return total


class Driver(abc.ABC):
    """A source of driver reads. Methods are synchronous and fast (NVML calls take
    microseconds; a simulated card is a locked file). All raise :class:`DriverError`."""

    kind: str = "abstract"

    @abc.abstractmethod
    def cards(self) -> list[CardInfo]:
        """Every card this backend sees, in PCI order."""

    @abc.abstractmethod
    def read(self, pci: str) -> Reading:
        """Read one card's free bytes and its processes, now."""

    def close(self) -> None:  # noqa: B027 (most backends hold nothing)
        """Release the backend (``nvmlShutdown``); idempotent."""


@dataclass(frozen=True)
class PidsGone:
    """Freed: none of ``pids`` holds memory on the card. Where per-process use is unknown, the
    card's free bytes must also have risen by ``expect_bytes`` over ``free_before``."""

    pids: frozenset[int]
    expect_bytes: int = 0
    free_before: int | None = None


@dataclass(frozen=True)
class UseAtMost:
    """Parked or lent: the use of ``pids`` is at most ``max_bytes``. Where per-process use is
    unknown, free must have risen by ``expect_bytes`` over ``free_before`` instead."""

    pids: frozenset[int]
    max_bytes: int
    expect_bytes: int = 0
    free_before: int | None = None


@dataclass(frozen=True)
class BytesBack:
    """``n_bytes`` came back: free rose to at least ``free_before + n_bytes``."""

    n_bytes: int
    free_before: int


Event = PidsGone | UseAtMost | BytesBack


def _shows(ev: Event, r: Reading) -> bool:
    if isinstance(ev, BytesBack):
        return r.free_bytes - ev.free_before >= ev.n_bytes
    use = r.use_of(set(ev.pids))
    limit = 0 if isinstance(ev, PidsGone) else ev.max_bytes
    if isinstance(ev, PidsGone) and use is not None:
        # "A PID gone": absent from the process list, not merely at 0 bytes.
        if not any(p in r.processes for p in ev.pids):
            return True
        return False
    if use is not None:
        return use <= limit
    if ev.free_before is None:
        return False
    return r.free_bytes - ev.free_before >= ev.expect_bytes


#: The confirmation helper's cadence (seconds; issue 34): a read at once, then after
#: ``CONFIRM_FIRST_S``, each delay ``CONFIRM_GROWTH`` times the one before, up to
#: ``CONFIRM_CAP_S``. The policy simulator (``bench/policy``) polls by these very numbers. The
#: cap was 250 ms: a waiter's grant waited up to that long past the driver's own lag on every
#: park and drain; a read is a few NVML calls, so one each 50 ms while a watch is open costs
#: nothing measurable.
CONFIRM_FIRST_S, CONFIRM_GROWTH, CONFIRM_CAP_S = 0.02, 2.0, 0.05


async def confirm(driver: Driver, pci: str, event: Event, deadline: float,
                  clock: Callable[[], float] = time.monotonic,
                  first_delay_s: float | None = None, max_delay_s: float | None = None,
                  event_at: float | None = None) -> Reading | None:
    """Return the first read of ``pci`` taken after the event that shows ``event``.

    Reads once at once, then after ``first_delay_s`` (default :data:`CONFIRM_FIRST_S`, 20 ms),
    growing by :data:`CONFIRM_GROWTH` up to ``max_delay_s`` (default :data:`CONFIRM_CAP_S`,
    50 ms), until ``deadline`` (on ``clock``). Returns ``None`` if the deadline passes first.
    A read that completed before ``event_at`` (default: the call) never counts. A
    :class:`DriverError` on one read is retried until the deadline, then raised.
    """
    event_at = clock() if event_at is None else event_at
    delay = CONFIRM_FIRST_S if first_delay_s is None else first_delay_s
    cap = CONFIRM_CAP_S if max_delay_s is None else max_delay_s
    last_err: DriverError | None = None
    while True:
        try:
            r = driver.read(pci)
            last_err = None
            if r.at >= event_at and _shows(event, r):
                return r
        except DriverError as e:
            last_err = e
        if clock() >= deadline:
            if last_err is not None:
                raise last_err
            return None
        await asyncio.sleep(min(delay, max(0.0, deadline - clock())))
        delay = min(delay * CONFIRM_GROWTH, cap)
