"""llama-swap: stop the running model, load the next one.

Modelled on llama-swap's FIFO scheduler (``internal/router/scheduler/fifo.go``; reference/
llama-swap.md "Requests during a start or swap"). For every request, in order:

1. a swap to the same model is in flight: join it (one load serves every waiter);
2. fast path: the model is ready, nothing must be evicted, and no in-flight swap evicts it:
   serve (``concurrencyLimit``, default 10 in flight per model, else 429 and the client retries
   after ``Retry-After: 1``);
3. it collides with an in-flight swap: queue;
4. it would evict a model with requests in flight: queue until those finish;
5. otherwise swap: stop the eviction set in parallel (graceful, waiting for each process to
   exit), then start the target and wait for its readiness poll.

The queue is re-walked in order whenever a swap finishes or a model's in-flight count drops to
zero. A swap never waits for the driver to show the memory free (the #97 failure class).

Eviction (the ``Swapper``):

- ``swap`` (``router="group"``): groups with ``swap: true``. With no groups llama-swap runs one
  model at a time on the whole machine; we give it the best groups an operator could write
  without a memory model: one group per set of engines that share a card (connected
  components), ``exclusive: false`` so groups on disjoint cards coexist. One card: one model at
  a time, llama-swap's default.
- ``swap-matrix`` (``router="matrix"``, PR #646): the operator lists the co-resident sets; we
  list every maximal set whose declared sizes fit each card's total. A request picks the set
  containing its model that evicts the fewest running models (every ``evict_cost`` is 1), ties
  to definition order (largest sets first, then by name).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from ..world import LOADING, READY, STOPPING
from .base import SimPolicy

__all__ = ["SwapPolicy", "card_components", "fitting_sets"]

CONCURRENCY_LIMIT = 10


def card_components(engines) -> dict[str, int]:
    """Group engines that share a card, transitively: ``{engine: group number}``."""
    parent = {e.name: e.name for e in engines}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in itertools.combinations(engines, 2):
        if set(a.cards) & set(b.cards):
            parent[find(a.name)] = find(b.name)
    roots = sorted({find(e.name) for e in engines})
    return {e.name: roots.index(find(e.name)) for e in engines}


def fitting_sets(wl) -> list[frozenset[str]]:
    """Every maximal set of engines whose declared sizes fit each card's total, largest first."""
    names = [e.name for e in wl.engines]
    ok = []
    for r in range(len(names), 0, -1):
        for combo in itertools.combinations(names, r):
            s = frozenset(combo)
            if any(s < big for big in ok):
                continue
            per_card = Counter()
            for n in combo:
                for p, b in wl.engine(n).size_bytes.items():
                    per_card[p] += b
            if all(b <= wl.card(p).total_bytes for p, b in per_card.items()):
                ok.append(s)
    return sorted(ok, key=lambda s: (-len(s), sorted(s)))


@dataclass
class _Swap:
    target: str
    evict: list[str]
    waiters: list = field(default_factory=list)
    stopping: set[int] = field(default_factory=set)


class SwapPolicy(SimPolicy):
    """llama-swap's FIFO scheduler with a group (``swap``) or matrix (``swap-matrix``) swapper."""

    def __init__(self, router: str = "group"):
        if router not in ("group", "matrix"):
            raise ValueError(f"router: expected 'group' or 'matrix', got {router!r}")
        self.router = router
        self.name = "swap" if router == "group" else "swap-matrix"

    def attach(self, world) -> None:
        super().attach(world)
        self.group = card_components(world.wl.engines)
        self.sets = fitting_sets(world.wl) if self.router == "matrix" else []
        self.active: dict[str, _Swap] = {}
        self.in_flight: Counter[str] = Counter()
        self.queued: list = []

    def extra(self) -> dict:
        if self.router == "matrix":
            return {"matrix_sets": [sorted(s) for s in self.sets]}
        return {"groups": sorted({tuple(sorted(m for m, g in self.group.items() if g == k))
                                  for k in self.group.values()})}

    # -- the swapper ------------------------------------------------------------------------
    def _state(self, model: str) -> str:
        proc = self.world.current[model]
        if proc is None:
            return "stopped"
        return {LOADING: "starting", READY: "ready"}.get(proc.state, "stopping")

    def _running(self, exclude: str) -> list[str]:
        run = {m for m in self.world.specs if self._state(m) != "stopped"}
        run |= {t for t in self.active if t != exclude}
        return sorted(run)

    def eviction_for(self, target: str, running: list[str]) -> list[str]:
        """Pure: the running models that must stop for ``target`` to run."""
        if self.router == "group":
            return [m for m in running if m != target and self.group[m] == self.group[target]]
        best, best_cost = None, None
        for s in self.sets:
            if target not in s:
                continue
            cost = sum(1 for m in running if m not in s)
            if best_cost is None or cost < best_cost:
                best, best_cost = s, cost
        keep = best or frozenset({target})
        return [m for m in running if m not in keep]

    def _collides(self, target: str, evict: list[str]) -> bool:
        for t, sw in self.active.items():
            if t == target:
                continue
            if t in evict or target in sw.evict or set(evict) & set(sw.evict):
                return True
        return False

    # -- the decision tree ------------------------------------------------------------------
    def on_arrival(self, job) -> None:
        if not self._decide(job):
            self.queued.append(job)

    def _decide(self, job) -> bool:
        """Steps (1)-(5) of the module docstring; False when the request stays queued."""
        m = job.engine
        if m in self.active:                                                    # (1)
            self.active[m].waiters.append(job)
            return True
        evict = self.eviction_for(m, self._running(m))
        if self._state(m) == "ready" and not evict and not self._collides(m, evict):  # (2)
            self._grant(job, m)
            return True
        if self._collides(m, evict):                                            # (3)
            return False
        if any(self.in_flight[x] > 0 for x in evict):                           # (4)
            return False
        self._start_swap(job, evict)                                            # (5)
        return True

    def _drain_queue(self) -> None:
        pending, self.queued = self.queued, []
        for job in pending:
            if not self._decide(job):
                self.queued.append(job)

    def _grant(self, job, model: str) -> None:
        if self.in_flight[model] >= CONCURRENCY_LIMIT:
            self.world.retry(job, 1.0, "429 concurrencyLimit")
            return
        self.world.forward(job, self.world.current[model])
        self.in_flight[model] += 1

    # -- swaps ------------------------------------------------------------------------------
    def _start_swap(self, job, evict: list[str]) -> None:
        sw = _Swap(job.engine, evict, [job])
        self.active[job.engine] = sw
        for m in evict:
            proc = self.world.current[m]
            if proc is None:
                continue
            sw.stopping.add(proc.id)
            if proc.state != STOPPING:
                self.world.stop(proc)
        if not sw.stopping:
            self._start_target(sw)

    def _start_target(self, sw: _Swap) -> None:
        proc = self.world.current[sw.target]
        if proc is not None and proc.state == READY:
            self._swap_done(sw)
        elif proc is None or proc.state == STOPPING:
            self.world.load(sw.target, health_poll=True)

    def _swap_done(self, sw: _Swap) -> None:
        del self.active[sw.target]
        proc = self.world.current[sw.target]
        for job in sw.waiters:
            if proc is not None and proc.state == READY:
                self._grant(job, sw.target)
            else:
                self.world.retry(job, self.world.mech.retry_after_s, "500 swap failed")
        self._drain_queue()

    def on_ready(self, proc) -> None:
        sw = self.active.get(proc.engine)
        if sw is not None and self.world.current[proc.engine] is proc:
            self._swap_done(sw)

    def on_exit(self, proc, crashed: bool) -> None:
        for sw in list(self.active.values()):
            if proc.id in sw.stopping:
                sw.stopping.discard(proc.id)
                if not sw.stopping:
                    self._start_target(sw)
            elif sw.target == proc.engine and crashed:
                self._swap_done(sw)   # the start failed: every waiter gets a 500 and retries
        self._drain_queue()

    def on_leave(self, job) -> None:
        if job in self.queued:
            self.queued.remove(job)
        for sw in self.active.values():
            if job in sw.waiters:
                sw.waiters.remove(job)      # the swap it started goes on (llama-swap's does)

    def on_job_end(self, job, ok: bool) -> None:
        self.in_flight[job.engine] -= 1
        if self.in_flight[job.engine] <= 0:
            del self.in_flight[job.engine]
            self._drain_queue()
