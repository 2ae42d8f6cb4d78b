"""ComfyUI's jobs, as berthd's ladder wants them: how many, and when the oldest arrived.

Source: issue 12 case 4 (a holder with a job running is not displaced until it ends), issue 16
("turns protect work, not idleness": an idle holder yields at once, but only one whose front
reports its jobs; one that never reports counts as busy); reference/hosts.md "Idle signals"
(``get_tasks_remaining()`` counts queued plus running under the queue's lock).

The node's agent reports :func:`work` through :class:`berth.client.JobReporter`, as
``berth run``'s front does: at once when ComfyUI turns busy or idle, else at most once a second.
"""

from __future__ import annotations

from typing import Any

from .gate import Gate

__all__ = ["work"]


def work(gate: Gate, queue: Any) -> tuple[int, float | None]:
    """``(jobs, oldest_at)``: the gated writes held or being handled now plus the prompts
    ComfyUI's queue has (queued or running, ``queue.get_tasks_remaining()``), and when the
    oldest of those whose arrival the gate saw arrived (``time.monotonic`` seconds; ``None``:
    none known). Forgets the arrival of each prompt that left the queue."""
    # Read the gate's times before the queue: a prompt the gate records after this read is
    # not forgotten for being missing from a queue read that came before its put.
    writes, queued_at = gate.arrivals()
    n = gate.in_flight + gate.holding + queue.get_tasks_remaining()
    try:
        running, pending = queue.get_current_queue()
        there = {str(item[1]) for item in [*running, *pending]}
    except Exception:                   # another ComfyUI's queue shape: keep the count alone
        return n, min(writes, default=None)
    gone = [pid for pid in queued_at if pid not in there]
    if gone:
        gate.forget(gone)
    times = writes + [t for pid, t in queued_at.items() if pid in there]
    return n, min(times, default=None)
