"""llama-swap: stop the running model, load the next one.

Modelled on llama-swap v250 (github.com/mostlygeek/llama-swap, tag v250, read at v250-5-g0bdb3720):
its run loop's FIFO scheduler (``internal/router/scheduler/fifo.go``: ``FIFO.OnRequest``,
``enqueue``, ``drainQueue``, ``OnServeDone``, ``collidesWith``, ``conflictsWithInFlight``), the
group swapper (``internal/router/group.go``: ``groupSwapper.EvictionFor``) and the matrix
solver (``internal/router/matrix.go``: ``matrixSwapper.EvictionFor``; config.example.yaml's
``matrix`` section for ``evict_costs``). For every request, in order:

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

**Queue order** (``FIFO.enqueue``, ``routing.scheduler.settings.fifo.priority``): a queued
request goes just before the first queued request of strictly lower priority, so higher
priorities are served first and equal ones keep their arrival order. The operator here gives
each model the priority its Berth entry has (``EngineSpec.priority``), as one who set both would.

**Same-model collation** (fifo.go's type comment, "A B C A B C --> A A B B C C", since #790):
not a rule of its own but what (1), (2) and the re-walk make of it: a request for the model
being swapped in joins that swap, one for a ready model with nothing to evict is served at
once past the queue, and the re-walk lets every queued request for the next model join the one
swap that the first of them starts.

Eviction (the ``Swapper``):

- ``swap`` (``router="group"``): ``groupSwapper.EvictionFor``: a running model of the target's
  group is evicted when the group has ``swap: true``; one of another group when the target's
  group is ``exclusive`` and the other is not ``persistent``. With no groups llama-swap runs one
  model at a time on the whole machine; we give it the best groups an operator could write
  without a memory model: one group per set of engines that share a card (connected
  components), ``swap: true``, ``exclusive: false`` (groups on disjoint cards coexist),
  ``persistent: false``. One card: one model at a time, llama-swap's default.
- ``swap-matrix`` (``router="matrix"``, PR #646): the operator lists the co-resident sets; we
  list every maximal set whose declared sizes fit each card's total. A request picks the set
  containing its model whose running models outside it cost least (the sum of their
  ``evict_costs``, default 1; the operator here sets none), ties to definition order (largest
  sets first, then by name).

Placement (issue 25), ``swap-matrix`` only, for engines of ``free`` placement: a llama-swap
model is one ``cmd`` with its ``CUDA_VISIBLE_DEVICES``, so an operator who lets an engine run on
any card writes one model per card set (``coder-14@gpu0`` … ``@gpu3``), one variant at most per
engine in each set, and a ``selectors:`` entry that maps the engine's name onto its variants.
llama-swap's ``warm`` selector sends a request to a ready variant, then a starting one, and
cold-starts its *first* target otherwise, which is fixed placement again. We read it
charitably: the matrix itself picks the variant, over every maximal set of variants whose
declared sizes fit each card, by the same rule as above (fewest running models evicted), ties to
definition order (the engine's own cards first, then the other card sets in card order; among
sets that keep as many, the first by name). :meth:`SwapPolicy.free_plan` solves it on demand
instead of listing every set (a set that fits extends to a maximal one, so the cheapest
eviction is the same). ``swap`` (groups) cannot place: a group member is one model.
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


def _variants(engine, cards: list[str]) -> list[tuple[str, ...]]:
    """An engine's variants in definition order: its own cards first, then every other set of
    as many cards, in card order (only its own for an engine of fixed placement)."""
    own = engine.cards
    if not engine.free:
        return [own]
    return [own, *(c for c in itertools.combinations(cards, len(own)) if c != own)]


def _fits(sizes: list[dict[str, int]], total: dict[str, int]) -> bool:
    per_card: Counter[str] = Counter()
    for s in sizes:
        per_card.update(s)
    return all(b <= total[p] for p, b in per_card.items())


@dataclass(frozen=True)
class Group:
    """One llama-swap group's flags (``routing.router.settings.groups``)."""

    swap: bool = True
    exclusive: bool = False
    persistent: bool = False


@dataclass
class _Swap:
    target: str
    evict: list[str]
    waiters: list = field(default_factory=list)
    stopping: set[int] = field(default_factory=set)
    #: the target's cards when the matrix placed it (``None``: its own cards)
    cards: tuple[str, ...] | None = None


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
        self.groups = {g: Group() for g in set(self.group.values())}
        #: the matrix's ``evict_costs`` (a model not named costs 1)
        self.evict_costs: dict[str, int] = {}
        #: ``fifo.priority``: each model's Berth priority
        self.priority = {e.name: e.priority for e in world.wl.engines}
        self.places = self.router == "matrix" and any(e.free for e in world.wl.engines)
        self.sets = fitting_sets(world.wl) if self.router == "matrix" and not self.places else []
        self.variants = {e.name: _variants(e, [c.pci for c in world.wl.cards])
                         for e in world.wl.engines} if self.places else {}
        self.active: dict[str, _Swap] = {}
        self.in_flight: Counter[str] = Counter()
        self.queued: list = []

    def extra(self) -> dict:
        if self.places:
            return {"matrix_variants": {e: len(v) for e, v in self.variants.items()}}
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
            tg = self.groups[self.group[target]]
            out = []
            for m in running:
                same = self.group[m] == self.group[target]
                if m != target and ((same and tg.swap) or (
                        not same and tg.exclusive and not self.groups[self.group[m]].persistent)):
                    out.append(m)
            return out
        best, best_cost = None, None
        for s in self.sets:
            if target not in s:
                continue
            cost = sum(self.evict_costs.get(m, 1) for m in running if m not in s)
            if best_cost is None or cost < best_cost:
                best, best_cost = s, cost
        keep = best or frozenset({target})
        return [m for m in running if m not in keep]

    def _cards_of(self, model: str) -> tuple[str, ...]:
        """The cards a running (or starting, or stopping) model holds or will hold."""
        sw = self.active.get(model)
        proc = self.world.current[model]
        if proc is None or (sw is not None and sw.cards is not None and proc.state == STOPPING):
            return sw.cards if sw is not None and sw.cards else self.world.specs[model].cards
        return proc.spec.cards

    def free_plan(self, target: str, running: list[str]) -> tuple[list[str], tuple[str, ...]]:
        """Pure: the matrix over variants (module docstring): the running models that must stop
        for ``target`` to run, and the cards of the variant it starts."""
        proc = self.world.current[target]
        if proc is not None and proc.state in (LOADING, READY):
            return [], proc.spec.cards           # a running variant serves: nothing to place
        others = [m for m in running if m != target]
        size = {m: self._sizes(m, self._cards_of(m)) for m in others}
        total = self.world.total
        best: tuple[int, tuple[str, ...], tuple[str, ...]] | None = None
        for cards in self.variants[target]:
            want = self._sizes(target, cards)
            for r in range(len(others), -1, -1):
                if best is not None and r <= best[0]:
                    break
                keep = next((k for k in itertools.combinations(others, r)
                             if _fits([want, *(size[m] for m in k)], total)), None)
                if keep is not None:
                    best = (r, cards, keep)
                    break
        if best is None:
            return list(others), self.world.specs[target].cards
        return [m for m in others if m not in best[2]], best[1]

    def _sizes(self, model: str, cards: tuple[str, ...]) -> dict[str, int]:
        spec = self.world.specs[model]
        return spec.size_bytes if cards == spec.cards else spec.on(cards).size_bytes

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
            self._enqueue(job)

    def _enqueue(self, job) -> None:
        """``FIFO.enqueue``: just before the first queued request of strictly lower priority."""
        p = self.priority[job.engine]
        i = next((k for k, q in enumerate(self.queued) if self.priority[q.engine] < p),
                 len(self.queued))
        self.queued.insert(i, job)

    def _decide(self, job) -> bool:
        """Steps (1)-(5) of the module docstring; False when the request stays queued."""
        m = job.engine
        if m in self.active:                                                    # (1)
            self.active[m].waiters.append(job)
            return True
        cards = None
        if self.places:
            evict, cards = self.free_plan(m, self._running(m))
        else:
            evict = self.eviction_for(m, self._running(m))
        if self._state(m) == "ready" and not evict and not self._collides(m, evict):  # (2)
            self._grant(job, m)
            return True
        if self._collides(m, evict):                                            # (3)
            return False
        if any(self.in_flight[x] > 0 for x in evict):                           # (4)
            return False
        self._start_swap(job, evict, cards)                                     # (5)
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
    def _start_swap(self, job, evict: list[str], cards: tuple[str, ...] | None = None) -> None:
        sw = _Swap(job.engine, evict, [job], cards=cards)
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
            self.world.load(sw.target, seen=self.world.mech.health_ready_s, cards=sw.cards)

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
