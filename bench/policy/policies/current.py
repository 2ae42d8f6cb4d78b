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

Placement (issue 25): an engine of ``free`` placement goes, at its admission, on the cards
(as many as its own) where the last read shows its load free, the set with the most free bytes
left over first (worst fit, as Ollama and Berth's first rule place: the most room for growth
nobody reserved); when it fits on none, on the set where (3) stops the fewest idle engines (then
the most free). Cards an earlier waiter holds are not candidates.

This is the failure mode the issue names ("a broker that admits by current need alone crashes
when memory grows"); LocalAI's LRU eviction without a per-model estimate is the closest peer.
"""

from __future__ import annotations

import itertools
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
            spec = self._placed(w.specs[e], held_cards)
            if spec is None:                                                    # (1)
                continue
            cards = set(spec.cards)
            cur = w.current[e]
            if cur is not None and cur.state in (LOADING, READY) and cur.after is None:
                self.waiting.remove(e)
                self._forward_held(cur)
                continue
            if cur is not None:
                continue    # its process is on its way out; it restarts from on_exit
            if all(self._free(p) >= spec.base_bytes[p] for p in cards):         # (2)
                self.waiting.remove(e)
                proc = w.load(e, cards=spec.cards if spec.free else None)
                self._forward_held(proc)
                continue
            self._make_room(spec)                                               # (3)
            held_cards |= cards

    def _placed(self, spec, held: set[str]):
        """The engine on the cards it goes on now (module docstring), ``None`` when an earlier
        waiter holds them (every set of them, for an engine of free placement)."""
        if not spec.free:
            return None if set(spec.cards) & held else spec
        sets = [spec.on(c) for c in itertools.combinations(sorted(self.world.total),
                                                           len(spec.cards))
                if not set(c) & held]
        if not sets:
            return None

        def left(s) -> int:
            return min(self._free(p) - b for p, b in s.base_bytes.items())

        fit = [s for s in sets if left(s) >= 0]
        if fit:
            return max(fit, key=left)
        return min(sets, key=lambda s: (self._room_plan(s)[0], -left(s)))

    def _make_room(self, spec) -> None:
        n, chosen = self._room_plan(spec)
        if n < len(self.world.procs) + 1:
            for proc in chosen:
                self.world.stop(proc)

    def _room_plan(self, spec) -> tuple[int, list]:
        """Step (3) worked out: how many idle engines must stop on ``spec``'s cards and which
        (``len(procs) + 1`` and ``[]`` when stopping them all would not do)."""
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
            return len(chosen), chosen
        return len(w.procs) + 1, []

    def _forward_held(self, proc) -> None:
        q = self.held[proc.engine]
        while q:
            self.world.forward(q.popleft(), proc)

    def on_ready(self, proc) -> None:
        if self.world.current[proc.engine] is proc and proc.state == READY:
            self._forward_held(proc)
