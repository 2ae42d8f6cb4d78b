"""What a run tells berthd about its engine's jobs, and what it tells its clients about a wait.

Source: issue 12 cases 4 and 6.

- :func:`job_reporter`: the front knows the requests in flight; berthd's ladder must too, so a
  holder with a job running is not displaced until it ends (bounded by the engine's
  ``max_job``), and a waiting client can be told who holds the card and with how many jobs.
  With the count goes the age of the oldest request the front has, so a busy holder serving
  requests older than a waiter's keeps its card (issue 16), and the count of model requests the
  front has started this lease, so one answered between two polls is not missed (issue 24: a
  fresh engine is not kept for a first request it already served).
  :class:`berth.client.JobReporter` reports at once when the engine turns busy or idle or serves
  unseen, and a changed count or age at most once per ``every_s`` (ComfyUI's node reports
  through the same class).
- :class:`WaitWords`: berthd says why a lease or a wake waits, and whether anything under way
  could end the wait (``lasting``). The run logs each reason when it changes (where llama-swap's
  users look: the model's own log), and passes it to the front, whose held requests then name it
  in their 503, or get it at once when the wait is lasting (unless the client asked to wait
  with ``X-Berth-Deadline``).
"""

from __future__ import annotations

import contextlib
import logging

from berth.client import JobReporter

__all__ = ["job_reporter", "WaitWords"]

log = logging.getLogger("berth.run")


def job_reporter(front, lease, served_from: int = 0, **kw) -> JobReporter:
    """The reporter of ``front``'s work (requests forwarded plus held, and when the oldest
    arrived) for ``lease`` (a :class:`berth.run.lease.LeaseClient`), with the model requests
    the front has started since its count stood at ``served_from`` (taken before the front
    opened for this lease: the held requests it forwards as it opens are this lease's), and
    the clients berthd's forecast reads (issue 34): the oldest request's, and the last
    answer's with when it ended. The front's last request ending reports at once."""
    reporter = JobReporter(lambda: (front.in_flight + front.holding, front.oldest_at),
                           lambda: lease.lease_id, lambda: lease.client,
                           served=lambda: front.served - served_from,
                           clients=lambda: (front.oldest_client, front.clients.answered_client,
                                            front.clients.answered_at),
                           held=lambda: (front.holding, front.oldest_held_at), **kw)
    front.clients.on_quiet = reporter.kick
    return reporter


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
