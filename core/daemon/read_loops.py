"""The broker's driver reads: the reader task (a read every ``read_interval``, at once after
every event) and the confirmation of each watch (seed 002 rule 1, issue 4 "The broker loop").

A mixin of :class:`~berth.daemon.broker.Broker`, its own job: both loops only submit to the
single writer (:meth:`Broker.submit`) and change nothing themselves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from berth.decide.effects import Until, Watch
from berth.driver.base import DriverError, confirm

if TYPE_CHECKING:
    from berth.daemon.broker import Broker

__all__ = ["ReadLoops"]

log = logging.getLogger("berth.daemon.broker")


class ReadLoops:
    """The reader task and the watches' confirmation, run on the broker's attributes
    (``cfg``, ``driver``, ``reads``, ``sched``, ``clock``, ``_kick``, ``submit``)."""

    async def _reader(self) -> None:
        interval = self.cfg.policy.read_interval
        while True:
            try:
                # Not wait_for: that wraps the wait in a task of its own and cancels it at
                # every timeout, twice the event loop's turns of a whole idle read.
                async with asyncio.timeout(_until_due(self, interval)):
                    await self._kick.wait()
            except TimeoutError:
                pass
            self._kick.clear()

            def apply(now):
                # The read is taken inside the single writer, so a grant it allows is decided
                # on it and nothing else (rule 1).
                return self.reads.observe_now(self.sched, now) + self.sched.tick(now)
            try:
                await self.submit(apply)
            except Exception:
                log.exception("applying a driver read failed")

    async def _watch(self, w: Watch) -> None:
        """Run the confirmation helper for one watch; report back with ``confirmed``."""
        while True:
            lease = self.sched.ledger.leases.get(w.lease_id)
            if lease is None:
                return
            pids, ev = self.reads.confirmation(lease, w)
            card = self.sched.ledger.cards[w.pci]
            deadline = max(w.deadline, self.clock() + 0.5)
            try:
                r = await confirm(self.driver, w.pci, ev, deadline, clock=self.clock,
                                  event_at=w.since)
            except DriverError as e:
                log.error("confirmation read of %s failed: %s", card.name, e)
                r = None
            if r is not None:
                use = r.use_of(pids) if r.processes_known else None

                def apply(now, use=use, w=w):
                    # The confirming read proves the event; what is granted on the freed
                    # memory is decided on a read taken now, inside the writer (rule 1).
                    return self.reads.observe_now(self.sched, now) + self.sched.confirmed(
                        w.lease_id, w.pci, w.until, now, use_bytes=use)
                await self.submit(apply)
                return
            if w.until is not Until.FREED:
                return           # the scheduler's deadline falls back to a drain
            # A drain has no fallback: keep watching until the memory is free.
            w = Watch(w.lease_id, w.pci, w.until, w.max_use_bytes, w.since,
                      self.clock() + self.cfg.policy.release_grace)


def _until_due(broker: "Broker", interval: float) -> float:
    """Seconds until the next pass: the read interval, or sooner when a turn ends (issue 34:
    an idle holder yields λ·rent after its answer) or a deadline falls due before it."""
    due = broker.sched.next_due()
    return interval if due is None else min(interval, max(0.0, due - broker.clock()))
