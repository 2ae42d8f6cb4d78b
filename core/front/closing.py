"""A front's close before a park or drain: :meth:`Closing.close_and_drain` and its fence
(issue 34), a mixin of :class:`berth.front.front.Front` (its state, held line and arrival times
are the front's own)."""

from __future__ import annotations

import asyncio

from .rules import FrontState

F = FrontState


class Closing:
    """The close that a park or drain waits on, with the fence (issue 34)."""

    @property
    def oldest_held_at(self) -> float | None:
        """When the oldest request held now (not forwarded) arrived (``time.monotonic``
        seconds; ``None``: none held). berthd parks a holder that holds requests fenced
        (issue 34)."""
        return self._arrived.get(self._line[0]) if self._line else None

    async def close_and_drain(self, timeout_s: float, why: str = "",
                              fence_at: float | None = None) -> bool:
        """``open -> closing``: hold new requests and wait up to ``timeout_s`` seconds for the
        in-flight ones to finish. Returns True when none is left. The state stays ``closing``:
        the caller then calls :meth:`sleep` (park done), :meth:`open` (called off) or
        :meth:`stopped` (seed 002: "Only then does the park, checkpoint or lend begin").
        In a state that forwards nothing (starting, asleep, waking, stopped) nothing is in flight:
        it returns True at once and leaves the state as it is.

        ``fence_at`` (``time.monotonic`` seconds; issue 34, the fence): the front stays open,
        forwarding as its slots allow and the oldest held first, while any request that
        arrived before that time is held or forwarded; the instant none is left it closes, so
        a newer request held for a slot stays held, and the wait is for what runs then. A
        waiter's park thus waits for the requests older than the waiter's, never for a backlog
        that came after it."""
        if self._state is F.OPEN:
            if fence_at is not None:
                self._fence, self._fence_why = fence_at, why
                self._fenced.clear()
                self._fence_check()
            else:
                self._move(F.CLOSING, why)
        elif self._state is not F.CLOSING:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                if self._fence is not None:
                    await self._fenced.wait()
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def _fence_check(self) -> None:
        """A fenced close goes ``open -> closing`` once no request older than its fence is
        held or forwarded; called, before any held request may take a freed slot, wherever one
        leaves (:meth:`close_and_drain`)."""
        at = self._fence
        if at is None or any(t < at for t in self._arrived.values()):
            return
        self._fence = None
        if self._state is F.OPEN:
            self._move(F.CLOSING, self._fence_why)
        self._fenced.set()
