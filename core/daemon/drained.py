"""Runs whose engine was drained and whose front stays: what the board lists as ``drained``.

Source: issue 35 ("a run outlives its engine's stops, by default"). After a drain, ``berth run``
keeps its front and its place but holds no lease: berthd's ledger no longer knows it. The run
tells berthd here, so ``berth status``, the board and the metrics show it as drained, with the
requests its front holds (its waiters), until its engine serves again.

The run speaks to it through ``PUT`` and ``DELETE /v1/drained/{engine}``
(:mod:`berth.daemon.api_drained`).

The entry belongs to the process that put it (the caller's PID and start time from
``SO_PEERCRED``, or ``owner_pid`` when it is the caller or a process it started): only that
process, or an operator, may replace or remove it, and it is dropped once that process is gone.
Nothing here is an admission input: the ladder never counts a drained run (it holds no memory).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from berth.process import ProcessId, alive

__all__ = ["DrainedRun", "DrainedRuns", "find_target"]

log = logging.getLogger("berth.daemon.api")


@dataclass
class DrainedRun:
    """One run whose engine is drained: ``since`` is seconds since the epoch; ``holding`` the
    requests its front holds; ``owner`` the run's process."""

    engine: str
    front: str | None
    holding: int
    why: str
    since: float
    owner: ProcessId | None
    asking: bool = False
    move_to: str | None = None
    move_from: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    #: who told berthd (``(pid, uid, gid)``): whose names these are (issue 26, owners.py)
    caller: tuple[int | None, int, int] | None = None

    def as_json(self, now: float) -> dict:
        return {"engine": self.engine, "front": self.front, "waiters": self.holding,
                "why": self.why, "since": round(self.since, 3),
                "drained_s": round(max(0.0, now - self.since), 3), "asking": self.asking,
                "pid": self.owner.pid if self.owner else None, "move_to": self.move_to,
                "move_from": list(self.move_from), "aliases": list(self.aliases)}


class DrainedRuns:
    """The drained runs by engine name. Read by the board outside the single writer: it
    changes nothing the ledger reads."""

    def __init__(self):
        self.runs: dict[str, DrainedRun] = {}

    def put(self, engine: str, body, owner: ProcessId | None,
            caller: tuple[int | None, int, int] | None = None) -> DrainedRun:
        """Record (or refresh) ``engine``'s entry from a ``DrainedBody`` told by ``caller``
        (``(pid, uid, gid)``); ``since`` stays while the same run refreshes it, and is the
        body's own (never later than now) when it gives one, so that a restarted berthd keeps
        when the drain happened."""
        old = self.runs.get(engine)
        now = time.time()
        if old is not None and old.owner == owner:
            since = old.since
        else:
            since = now if body.since is None else min(body.since, now)
        run = DrainedRun(engine, body.front, body.holding, body.why or "drained", since, owner,
                         body.asking, body.move_to, tuple(body.move_from or ()),
                         tuple(body.aliases or ()), caller)
        self.runs[engine] = run
        return run

    def remove(self, engine: str) -> bool:
        return self.runs.pop(engine, None) is not None

    def board(self) -> list[dict]:
        """The entries as the board lists them, oldest first; those whose run is gone are
        dropped first."""
        for name in [n for n, r in self.runs.items() if r.owner is not None and not alive(r.owner)]:
            log.info("drained %s: its run is gone", name)
            del self.runs[name]
        now = time.time()
        return [r.as_json(now) for r in sorted(self.runs.values(), key=lambda r: r.since)]




def find_target(broker, target: str):
    """The lease an operator action names (a lease id or an engine name): ``broker.sched.find``,
    except that an engine whose run is drained (no lease, its front waiting) raises
    ``ValueError`` (a 409) saying so and what starts it again, not ``KeyError``'s "no lease or
    engine named" while ``berth status`` lists it as drained. Raises ``KeyError`` for a name
    berthd does not know."""
    try:
        return broker.sched.find(target)
    except KeyError:
        drained = getattr(broker, "drained", None)
        run = drained.runs.get(target) if drained is not None else None
        if run is None or (run.owner is not None and not alive(run.owner)):
            raise
        behind = f" behind its front {run.front}" if run.front else ""
        raise ValueError(f"{target} is drained: its run waits{behind} with no lease, so no "
                         "operator action applies; its next request (a write) starts it "
                         "again") from None
