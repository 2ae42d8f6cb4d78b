"""A discrete-event loop in virtual time: a heap of ``(time, seq, callback)``.

Events at the same time run in the order they were scheduled (``seq`` breaks ties), so a
callback scheduled "now" runs after everything already due now. Nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

__all__ = ["Loop", "Handle"]


class Handle:
    """A scheduled callback; :meth:`cancel` makes the loop skip it."""

    __slots__ = ("at_s", "fn", "args", "cancelled")

    def __init__(self, at_s: float, fn: Callable, args: tuple):
        self.at_s, self.fn, self.args, self.cancelled = at_s, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """Virtual time in seconds from 0. ``after_each`` (if set) runs after every event; the
    accounting tests use it to check the machine between events."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Handle]] = []
        self._seq = itertools.count()
        self._stopped = False
        self.after_each: Callable[[], None] | None = None
        self.events = 0

    def at(self, at_s: float, fn: Callable, *args) -> Handle:
        """Run ``fn(*args)`` at virtual time ``at_s`` (never before now)."""
        h = Handle(max(at_s, self.now), fn, args)
        heapq.heappush(self._heap, (h.at_s, next(self._seq), h))
        return h

    def after(self, delay_s: float, fn: Callable, *args) -> Handle:
        return self.at(self.now + max(0.0, delay_s), fn, *args)

    def soon(self, fn: Callable, *args) -> Handle:
        """Run ``fn(*args)`` now, after the events already due now (a posted completion)."""
        return self.at(self.now, fn, *args)

    def stop(self) -> None:
        self._stopped = True

    def run(self, until_s: float) -> None:
        """Run events in time order until the heap is empty, :meth:`stop` is called, or the next
        event lies after ``until_s``."""
        while self._heap and not self._stopped:
            at_s, _, h = self._heap[0]
            if at_s > until_s:
                break
            heapq.heappop(self._heap)
            if h.cancelled:
                continue
            self.now = at_s
            h.fn(*h.args)
            self.events += 1
            if self.after_each is not None:
                self.after_each()
