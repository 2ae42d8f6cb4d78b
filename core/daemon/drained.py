"""Runs whose engine was drained and whose front stays: what the board lists as ``drained``.

Source: issue 35 ("a run outlives its engine's stops, by default"). After a drain, ``berth run``
keeps its front and its place but holds no lease: berthd's ledger no longer knows it. The run
tells berthd here, so ``berth status``, the board and the metrics show it as drained, with the
requests its front holds (its waiters), until its engine serves again.

The run speaks to it through ``PUT`` and ``DELETE /v1/drained/{engine}``
(:mod:`berth.daemon.api_drained`).

``berth wake ENGINE`` on a drained run (:func:`wake_drained`) marks its entry "wake asked": the
run hears it through its long-poll of ``GET /v1/drained/{engine}/wake``, answered at once, and
asks for its card again as a write would make it (through the queue, like any lease). The mark
stays until the run says it asks (``asking``) or its entry goes. The other operator actions on
a drained run are a 409 that says so (:func:`find_target`).

The entry belongs to the process that put it (the caller's PID and start time from
``SO_PEERCRED``, or ``owner_pid`` when it is the caller or a process it started): only that
process, or an operator, may replace or remove it, and it is dropped once that process is gone.
Nothing here is an admission input: the ladder never counts a drained run (it holds no memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from berth.process import ProcessId, alive

__all__ = ["DrainedRun", "DrainedRuns", "find_target", "wake_drained"]

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
    #: an operator's ``berth wake`` asked the run to ask for its card again (not yet heard)
    wake_asked: bool = False

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
        #: set when ``berth wake`` asks an engine's run, for its long-poll (:meth:`wait_wake`)
        self._wakes: dict[str, asyncio.Event] = {}

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
        # A wake asked stays until the same run says it asks for its card (it heard).
        run.wake_asked = bool(old is not None and old.owner == owner and old.wake_asked
                              and not body.asking)
        self.runs[engine] = run
        return run

    def remove(self, engine: str) -> bool:
        self._fire(engine)
        return self.runs.pop(engine, None) is not None

    def live(self, engine: str) -> DrainedRun | None:
        """``engine``'s entry while its run is alive, else ``None``."""
        run = self.runs.get(engine)
        if run is None or (run.owner is not None and not alive(run.owner)):
            return None
        return run

    def ask_wake(self, engine: str) -> DrainedRun:
        """An operator's ``berth wake``: the run is told (at once, through :meth:`wait_wake`)
        to ask for its card again. Raises ``KeyError`` when ``engine`` has no entry."""
        run = self.runs[engine]
        if not run.asking:
            run.wake_asked = True
            self._fire(engine)
        return run

    def _fire(self, engine: str) -> None:
        event = self._wakes.pop(engine, None)
        if event is not None:
            event.set()

    async def wait_wake(self, engine: str, timeout_s: float) -> bool:
        """Whether an operator asked ``engine``'s run to start again: at once when asked
        already, else when it is asked or its entry goes, or after ``timeout_s``."""
        run = self.runs.get(engine)
        if run is None or not run.wake_asked:
            event = self._wakes.setdefault(engine, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
            run = self.runs.get(engine)
        return bool(run is not None and run.wake_asked)

    def board(self) -> list[dict]:
        """The entries as the board lists them, oldest first; those whose run is gone are
        dropped first."""
        for name in [n for n, r in self.runs.items() if r.owner is not None and not alive(r.owner)]:
            log.info("drained %s: its run is gone", name)
            del self.runs[name]
        now = time.time()
        return [r.as_json(now) for r in sorted(self.runs.values(), key=lambda r: r.since)]




def find_target(broker, target: str, op: str | None = None):
    """The lease an operator action ``op`` names (a lease id or an engine name):
    ``broker.sched.find``, except that an engine whose run is drained (no lease, its front
    waiting) raises ``ValueError`` (a 409) saying so and what starts it again, not
    ``KeyError``'s "no lease or engine named" while ``berth status`` lists it as drained.
    Raises ``KeyError`` for a name berthd does not know."""
    try:
        return broker.sched.find(target)
    except KeyError:
        drained = getattr(broker, "drained", None)
        run = drained.live(target) if drained is not None else None
        if run is None:
            raise
        behind = f" behind its front {run.front}" if run.front else ""
        what = f"{op} does not apply" if op else "no operator action applies"
        raise ValueError(f"{target} is drained: its run waits{behind} with no lease, so {what}; "
                         f"`berth wake {target}` or its next request (a write) starts it "
                         "again") from None


def wake_drained(broker, target: str) -> dict | None:
    """``berth wake TARGET`` where TARGET is an engine whose run is drained (a live entry): its
    run asks for its card again, as a write would make it, and its engine starts once granted
    (through the queue). The operator's answer (``lease`` ``None``), or ``None`` when TARGET
    names no drained run (the action goes to the lease, as ever)."""
    drained = getattr(broker, "drained", None)
    run = drained.live(target) if drained is not None else None
    if run is None:
        return None
    if run.asking:
        note = "its run asks for its card already (it waits in the queue); it starts when granted"
    else:
        drained.ask_wake(target)
        note = "its run asks for its card again; it starts when granted"
    return {"lease": None, "engine": target, "op": "wake", "drained": True, "notes": [note]}
