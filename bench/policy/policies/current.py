"""current-need: a broker that admits an engine on its measured need, with no reservation.

The bound of seed 000 "Current need only": "Reserve only the blocks the prompt requires and
allocate as the sequence grows ... It provides no guarantee of completion." Here, at engine
granularity:

1. An engine with a request and no process waits in arrival order. Each card is strict: an
   earlier waiter holds its cards, so nothing is starved.
2. It starts when the last driver read (every ``read_interval_s``) shows its load (the weights
   and context, ``base_bytes``) free on every card. Loads already under way count for what they
   have still to allocate, so two loads never take the same free bytes.
3. If it does not fit, idle engines on its cards (nothing running, nothing waiting) stop,
   least recently used first, but only when stopping them would make it fit.
4. Nothing reserves the engines' growth. Growth that collides is an OOM: the allocating engine
   dies, its requests fail and retry, and it restarts through (1).

This is the failure mode the issue names ("a broker that admits by current need alone crashes
when memory grows"); LocalAI's LRU eviction without a per-model estimate is the closest peer.
"""

from __future__ import annotations

from collections import deque

from ..world import EXITED, LOADING, READY, STOPPING
from .base import SimPolicy

__all__ = ["CurrentNeedPolicy"]


class CurrentNeedPolicy(SimPolicy):
    name = "current-need"

    def attach(self, world) -> None:
        super().attach(world)
        self.held = {e: deque() for e in world.specs}
        self.waiting: list[str] = []
        self.snap_free = {p: 0 for p in world.total}
        self.snap_res: dict[int, dict[str, int]] = {}

    def on_arrival(self, job) -> None:
        proc = self.world.current[job.engine]
        if proc is not None and proc.state in (LOADING, READY) and proc.after is None:
            self.world.forward(job, proc)
            return
        self.held[job.engine].append(job)
        if job.engine not in self.waiting:
            self.waiting.append(job.engine)
        self._admit()

    def on_leave(self, job) -> None:
        if job in self.held[job.engine]:
            self.held[job.engine].remove(job)

    def on_read(self, now: float) -> None:
        w = self.world
        self.snap_free = {p: w.free(p) for p in w.total}
        self.snap_res = {p.id: dict(p.res) for p in w.procs if p.state == LOADING}
        self._admit()

    def on_exit(self, proc, crashed: bool) -> None:
        if self.held[proc.engine] and proc.engine not in self.waiting:
            self.waiting.append(proc.engine)
        self._admit()

    def _free(self, pci: str) -> int:
        """Free bytes by the last read, less what loads under way have still to allocate."""
        owed = 0
        for p in self.world.procs:
            if p.state == LOADING and pci in p.res:
                owed += p.spec.base_bytes[pci] - self.snap_res.get(p.id, {}).get(pci, 0)
        return self.snap_free[pci] - owed

    def _admit(self) -> None:
        """Steps (1)-(3) of the module docstring."""
        w = self.world
        held_cards: set[str] = set()
        for e in list(self.waiting):
            spec = w.specs[e]
            cards = set(spec.cards)
            if cards & held_cards:                                              # (1)
                continue
            cur = w.current[e]
            if cur is not None and cur.state in (LOADING, READY) and cur.after is None:
                self.waiting.remove(e)
                self._forward_held(cur)
                continue
            if cur is not None:
                continue    # its process is on its way out; it restarts from on_exit
            if all(self._free(p) >= spec.base_bytes[p] for p in cards):         # (2)
                self.waiting.remove(e)
                proc = w.load(e)
                self._forward_held(proc)
                continue
            self._make_room(spec)                                               # (3)
            held_cards |= cards

    def _make_room(self, spec) -> None:
        w = self.world
        coming = {p: self._free(p) for p in spec.cards}
        for proc in w.procs:
            if proc.state in (STOPPING, EXITED):
                for p in spec.cards:
                    coming[p] += proc.res.get(p, 0)
        idle = [proc for proc in w.procs
                if proc.state == READY and proc.after is None and not proc.busy
                and not self.held[proc.engine] and set(proc.res) & set(spec.cards)]
        idle.sort(key=lambda proc: w.last_used_s[proc.engine])
        chosen = []
        for proc in idle:
            if all(coming[p] >= spec.base_bytes[p] for p in spec.cards):
                break
            chosen.append(proc)
            for p in spec.cards:
                coming[p] += proc.res.get(p, 0)
        if all(coming[p] >= spec.base_bytes[p] for p in spec.cards):
            for proc in chosen:
                w.stop(proc)

    def _forward_held(self, proc) -> None:
        q = self.held[proc.engine]
        while q:
            self.world.forward(q.popleft(), proc)

    def on_ready(self, proc) -> None:
        if self.world.current[proc.engine] is proc and proc.state == READY:
            self._forward_held(proc)
