"""Measured switch costs: how long a park, a restore (wake) and a cold start took, per engine.

Source: issue 14 "Measured switch costs"; seed 002 "Many machines" (a node's gateway lists its
measured switch costs). berthd feeds :meth:`SwitchCosts.note` with every timeline note it writes
(``lease id, engine, kind, time``), from real events only, and serves :meth:`SwitchCosts.as_json`
in its status JSON under ``switch_costs``. The gateway reads them to rank machines.

Each switch is the time between two notes of one lease (the broker's monotonic clock, seconds):

==============  ======================  ==================================================
cost            starts at               ends at
==============  ======================  ==================================================
``park_s``      ``park`` (instructed)   ``parked`` (the driver confirmed the memory gone)
``restore_s``   ``resume`` (instructed) ``wake`` (the run reported it woke)
``cold_start_s`` ``grant``              ``ready`` (the engine first answered)
==============  ======================  ==================================================

A switch that ends another way (``park.off``, ``fallback``, ``exit``, ``freed``, a failed
wake) is dropped, not counted. Each figure is the median of the last :data:`KEEP` samples.
"""

from __future__ import annotations

import collections
import statistics

__all__ = ["SwitchCosts", "KEEP", "SPANS"]

#: Samples kept per engine and cost (the median is over these).
KEEP = 9

#: cost name -> (starting note kind, ending note kind)
SPANS: dict[str, tuple[str, str]] = {
    "park_s": ("park", "parked"),
    "restore_s": ("resume", "wake"),
    "cold_start_s": ("grant", "ready"),
}
_STARTS = {start: cost for cost, (start, _) in SPANS.items()}
_ENDS = {end: cost for cost, (_, end) in SPANS.items()}
#: Notes after which no switch of the lease is under way any more.
_CANCELS = frozenset({"park.off", "fallback", "exit", "freed", "drain", "rejected", "never"})


class SwitchCosts:
    """Switch durations per engine, from note pairs. Pure bookkeeping: no clock of its own
    (times come with the notes), no I/O."""

    def __init__(self, keep: int = KEEP):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._open: dict[tuple[str, str], float] = {}     # (lease id, cost) -> start time
        self._samples: dict[str, dict[str, collections.deque[float]]] = {}

    def note(self, lease_id: str | None, engine: str | None, kind: str, at: float) -> float | None:
        """Take in one timeline note. Returns the duration recorded (seconds), if it ended a
        switch. ``kind`` may be a StrEnum (the broker's operation names)."""
        if not lease_id or not engine:
            return None
        kind = str(kind)
        cost = _STARTS.get(kind)
        if cost is not None:
            self._open[(lease_id, cost)] = at
            return None
        cost = _ENDS.get(kind)
        if cost is not None:
            start = self._open.pop((lease_id, cost), None)
            if start is None or at < start:
                return None
            took = at - start
            per = self._samples.setdefault(engine, {})
            per.setdefault(cost, collections.deque(maxlen=self.keep)).append(took)
            return took
        if kind in _CANCELS:
            for c in SPANS:
                self._open.pop((lease_id, c), None)
        return None

    def of(self, engine: str) -> dict:
        """``{"park_s", "restore_s", "cold_start_s"}`` medians in seconds (``None`` without a
        sample) and ``samples``: how many each median is over."""
        per = self._samples.get(engine, {})
        out: dict = {c: (round(statistics.median(per[c]), 4) if per.get(c) else None)
                     for c in SPANS}
        out["samples"] = {c: len(per.get(c, ())) for c in SPANS}
        return out

    def as_json(self) -> dict[str, dict]:
        """Every engine with at least one sample: ``{engine: of(engine)}``."""
        return {e: self.of(e) for e in sorted(self._samples)}
