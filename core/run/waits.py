"""What a run tells berthd about its engine's jobs, and what it tells its clients about a wait.

Source: issue 12 cases 4 and 6.

- :class:`JobReporter`: the front knows the requests in flight; berthd's ladder must too, so a
  holder with a job running is not displaced until it ends (bounded by the engine's
  ``max_job``), and a waiting client can be told who holds the card and with how many jobs.
  With the count goes the age of the oldest request the front has, so a busy holder serving
  requests older than a waiter's keeps its card (issue 16). It reports at once when the engine
  turns busy or idle, and a changed count or age at most once per ``every_s``.
- :class:`WaitWords`: berthd says why a lease or a wake waits, and whether anything under way
  could end the wait (``lasting``). The run logs each reason when it changes (where llama-swap's
  users look: the model's own log), and passes it to the front, whose held requests then name it
  in their 503, or get it at once when the wait is lasting (unless the client asked to wait
  with ``X-Berth-Deadline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

__all__ = ["JobReporter", "WaitWords"]

log = logging.getLogger("berth.run")


class JobReporter:
    """Polls ``front`` every ``poll_s`` seconds and tells berthd (``POST /v1/leases/{id}/jobs``
    through ``lease``, a :class:`berth.run.lease.LeaseClient`) when its work changes: the
    requests it forwards plus those it holds (queued at the front is work for this engine too),
    and the age of the oldest of them. At once between zero and non-zero, else at most once per
    ``every_s``. A failed report (berthd away, no lease) is tried again at the next poll.

    The age (seconds at the report, not this process's clock) is what crosses to berthd, which
    turns it into its own clock's time of arrival (issue 16: FIFO turns)."""

    def __init__(self, front, lease, *, poll_s: float = 0.05, every_s: float = 1.0):
        self.front, self.lease = front, lease
        self.poll_s, self.every_s = poll_s, every_s
        self.sent: tuple[int, float | None] | None = None
        self._sent_at = float("-inf")
        self._lease_id: str | None = None

    def work(self) -> tuple[int, float | None]:
        """``(requests forwarded or held, when the oldest arrived)`` at the front now."""
        return self.front.in_flight + self.front.holding, self.front.oldest_at

    async def run(self) -> None:
        while True:
            n, oldest = self.work()
            now = time.monotonic()
            if self.lease.lease_id != self._lease_id:
                self.sent = None           # a new lease: berthd knows nothing of its jobs
            edge = self.sent is None or (n == 0) != (self.sent[0] == 0)
            if (n, oldest) != self.sent and (edge or now - self._sent_at >= self.every_s):
                try:
                    await self.send(n, None if oldest is None else max(0.0, now - oldest))
                    self.sent, self._sent_at = (n, oldest), now
                except Exception as e:       # berthd away: it learns the count when back
                    log.debug("could not report %s requests in flight: %s", n, e)
            await asyncio.sleep(self.poll_s)

    async def send(self, n: int, oldest_age_s: float | None = None) -> None:
        lid = self.lease.lease_id
        if not lid:
            raise RuntimeError("no lease")
        if lid != self._lease_id:          # a new lease (berthd lost the old): say it again
            self._lease_id = lid
        body: dict = {"in_flight": n}
        if oldest_age_s is not None:
            body["oldest_age_s"] = round(oldest_age_s, 3)
        await self.lease.client.call("POST", f"/v1/leases/{lid}/jobs", body)


class WaitWords:
    """The current wait of this run's lease, as berthd said it: ``why`` (words or ``None``),
    ``lasting`` and berthd's ``version`` of it (a long poll returns when it changes)."""

    def __init__(self, engine: str, front=None):
        self.engine, self.front = engine, front
        self.why: str | None = None
        self.lasting = False
        self.version = 0

    def update(self, wait: dict | None) -> None:
        """Take berthd's ``{"why", "lasting", "version"}`` (``None``: not waiting)."""
        wait = wait or {}
        why, lasting = wait.get("why"), bool(wait.get("lasting"))
        self.version = int(wait.get("version") or 0)
        if (why, lasting) == (self.why, self.lasting):
            return
        if why:
            log.info("%s waits: %s%s", self.engine, why,
                     " (nothing under way can change that: held requests are answered now)"
                     if lasting else "")
        elif self.why:
            log.info("%s no longer waits", self.engine)
        self.why, self.lasting = why, lasting
        if self.front is not None:
            with contextlib.suppress(Exception):
                self.front.set_cause(why, lasting)
