"""Which machine answers a request first (issue 27 "Rank by expected time to first byte"). Pure:
no I/O, no clock (ages come in as numbers).

Each candidate falls in one category, best first (:data:`CATEGORIES`):

1. ``ready_idle``: serving (active or lent, its engine answered), nothing queued there;
2. ``ready_busy``: serving, with requests queued or in flight there: the shorter queue first;
3. ``unknown``: berthd cannot be read there; routed as configured, as if it served;
4. ``parked``: its measured median restore there (:data:`DEFAULT_RESTORE_S` before one);
5. ``loading``: its lease is granted and the engine still loads: the measured cold start less
   how long it has been loading (:data:`DEFAULT_COLD_START_S` before a measure);
6. ``cold``: not running there (waiting for a lease, drained with its front kept, or no lease):
   its measured cold start;
7. ``stopping``: draining.

Within a category the expected seconds to the first byte (``expected_s``: the switch time above,
0 for a serving engine, plus the peer's measured round trip) order the candidates, then the
queue, then this machine before a peer. A loading engine here therefore yields to the same model
ready on a peer, and a parked one to a busy one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Candidate", "rank", "CATEGORIES", "DEFAULT_RESTORE_S", "DEFAULT_COLD_START_S"]

#: Expected restore (s) of a parked engine whose machine has measured none yet.
DEFAULT_RESTORE_S = 5.0
#: Expected cold start (s) of an engine not running whose machine has measured none yet.
DEFAULT_COLD_START_S = 30.0

CATEGORIES = ("ready_idle", "ready_busy", "unknown", "parked", "loading", "cold", "stopping")
_RANK = {c: i for i, c in enumerate(CATEGORIES)}
_OF_STATE = {"parked": "parked", "loading": "loading", "waiting": "cold", "not running": "cold",
             "drained": "cold", "draining": "stopping", "unknown": "unknown"}


@dataclass(frozen=True)
class Candidate:
    """One machine that serves the model: ``machine`` (its name), ``local`` (this one),
    ``state`` (a :data:`berth.gateway.table.STATES` word), ``queue`` (requests queued or in
    flight there), ``costs`` (that machine's measured switch costs for the engine:
    ``restore_s``, ``cold_start_s``, seconds or None), ``rtt_s`` (the round trip to that
    machine, seconds; 0 here), ``loading_s`` (how long a loading engine has loaded, seconds),
    ``ref``: the caller's handle."""

    machine: str
    local: bool
    state: str
    queue: int = 0
    costs: dict | None = None
    ref: object = None
    rtt_s: float = 0.0
    loading_s: float = 0.0

    @property
    def category(self) -> str:
        if self.state in ("active", "lent"):
            return "ready_idle" if self.queue <= 0 else "ready_busy"
        return _OF_STATE.get(self.state, "cold")

    def _cost(self, name: str, default: float) -> float:
        v = (self.costs or {}).get(name)
        return default if v is None else float(v)

    @property
    def expected_s(self) -> float:
        """Seconds before the first byte can come: the switch the engine needs there (see the
        module docstring) plus the round trip."""
        cat = self.category
        if cat == "parked":
            wait = self._cost("restore_s", DEFAULT_RESTORE_S)
        elif cat == "loading":
            wait = max(0.0, self._cost("cold_start_s", DEFAULT_COLD_START_S) - self.loading_s)
        elif cat in ("cold", "stopping"):
            wait = self._cost("cold_start_s", DEFAULT_COLD_START_S)
        else:
            wait = 0.0
        return wait + self.rtt_s

    def key(self) -> tuple:
        cat = self.category
        first = self.queue if cat == "ready_busy" else self.expected_s
        return (_RANK[cat], first, self.expected_s, self.queue, not self.local, self.machine)

    def as_dict(self) -> dict:
        """The ranking inputs, for the status JSON and ``/v1/models``."""
        return {"category": self.category, "expected_s": round(self.expected_s, 4),
                "queue": self.queue, "rtt_s": round(self.rtt_s, 4),
                "loading_s": round(self.loading_s, 3)}


def rank(cands: list[Candidate]) -> list[Candidate]:
    """``cands`` best first (see the module docstring)."""
    return sorted(cands, key=Candidate.key)
