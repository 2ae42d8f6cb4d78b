"""Which machine serves a request soonest (issue 14 "Many machines"). Pure: no I/O, no clock.

Candidates are ranked, best first, by (1) the engine's state on that machine: awake (active or
lent) beats parked, which beats not running (waiting, drained or stopped), which beats draining;
(2) the expected switch time there: the machine's measured median restore for a parked engine,
its cold start for one not running (:data:`DEFAULT_RESTORE_S`, :data:`DEFAULT_COLD_START_S`
before a measure exists); (3) the shorter queue; (4) this machine before a peer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Candidate", "rank", "DEFAULT_RESTORE_S", "DEFAULT_COLD_START_S", "STATE_RANK"]

#: Expected restore (s) of a parked engine whose machine has measured none yet.
DEFAULT_RESTORE_S = 5.0
#: Expected cold start (s) of an engine not running whose machine has measured none yet.
DEFAULT_COLD_START_S = 30.0

#: Lower serves sooner. ``unknown``: berthd cannot be read; the route is tried as configured.
STATE_RANK = {"active": 0, "lent": 0, "unknown": 1, "parked": 1, "waiting": 2,
              "not running": 2, "draining": 3}


@dataclass(frozen=True)
class Candidate:
    """One machine that serves the model: ``machine`` (its name), ``local`` (this one),
    ``state`` (a :data:`berth.gateway.table.STATES` word), ``queue`` (requests waiting there),
    ``costs`` (that machine's measured switch costs for the engine: ``restore_s``,
    ``cold_start_s``, seconds or None), ``ref``: the caller's handle."""

    machine: str
    local: bool
    state: str
    queue: int = 0
    costs: dict | None = None
    ref: object = None

    def expected_s(self) -> float:
        """Seconds before it can start serving: 0 awake, a restore parked, a cold start else."""
        c = self.costs or {}
        r = STATE_RANK.get(self.state, 3)
        if r == 0:
            return 0.0
        if self.state in ("parked", "unknown"):
            v = c.get("restore_s")
            return DEFAULT_RESTORE_S if v is None else float(v)
        v = c.get("cold_start_s")
        return DEFAULT_COLD_START_S if v is None else float(v)

    def key(self) -> tuple:
        return (STATE_RANK.get(self.state, 3), self.expected_s(), self.queue,
                0 if self.local else 1, self.machine)


def rank(cands: list[Candidate]) -> list[Candidate]:
    """``cands`` best first (see the module docstring)."""
    return sorted(cands, key=Candidate.key)
