"""Ollama: evict idle models by shortest keep_alive to fit, then reload.

Modelled on Ollama's scheduler (github.com/ollama/ollama, ``server/sched.go`` at v0.33.0-rc2,
commit fb3076099: ``Scheduler.processPending``, ``Scheduler.load``'s pre-flight fit,
``selectLlamaServerPlacement`` and ``bestSingleGPUFit``, ``updateFreeSpace``,
``findRunnerToUnload`` with ``ByDurationAndName``, ``waitForVRAMRecovery``; ``defaultModelsPerGPU``
3; reference/peers.md "Ollama"):

- **Fast path.** A request for a model that is loaded (or loading) and not being unloaded goes
  straight to its runner, which serves ``OLLAMA_NUM_PARALLEL`` at once (we set it to the
  engine's ``slots``, so every policy has the same engines).
- **Pending loop.** Other requests queue (``OLLAMA_MAX_QUEUE`` 512, then "server busy") and one
  loop handles them in order, blocking on each eviction:

  1. the model has a runner: use it;
  2. its runner is being unloaded: wait for the unload;
  3. ``OLLAMA_MAX_LOADED_MODELS`` (3 per GPU) reached: unload one (the victim order below);
  4. no runner on its cards: load it (the first model always loads);
  5. a runner on its cards is still loading: retry in 250 ms, at the back of the queue;
  6. it fits: every card's estimate ≤ 80 % of free memory, free being
     ``min(driver free, total − Σ estimates of loaded runners)``: load it;
  7. otherwise unload one victim and wait for the unload, then go to (1).

- **Estimate**: the declared size (Ollama's estimate is deliberately conservative: weights plus
  the KV cache for the whole context).
- **Victim**: runners sorted by shortest keep_alive, then by name; the first idle one, else the
  first, once its requests finish. We only consider runners on the target's cards (Ollama
  considers all; on a multi-card box that would evict models that free nothing).
- **Unload** waits for VRAM recovery (``waitForVRAMRecovery``): a baseline read before the
  unload, then a poll every 250 ms until free memory rose by more than 75 % of the runner's
  memory, or 5 s passed; a runner that crashed shows no change and pays the whole 5 s. We take
  the runner's memory as what it actually used (Ollama parses each runner's use after its
  load), not the conservative estimate, so a lazily growing engine is not charged the timeout.
- **keep_alive** (5 min default): a runner idle that long is unloaded.
- **Placement** (engines of ``free`` placement, issue 34): Ollama places a runner at each load.
  ``bestSingleGPUFit``: among the cards where the estimate is at most 80 % of the card's free
  memory (``min(driver free, total − Σ estimates)``, as ``updateFreeSpace`` computes it), the
  one with the most free; none: unload a victim and try again. An engine of several cards takes
  as many cards, each chosen the same way (Ollama would spread one model's layers over every
  card instead; the simulator's engines have fixed per-card sizes). For these engines the
  victim is chosen among all runners, as ``findRunnerToUnload`` does; an engine of fixed
  placement (every other workload) keeps its own cards and the victims on them.
- **Readiness** (``llm/server.go``: ``llmServer.WaitUntilRunning``): a request for a runner
  that is loading waits until the scheduler's poll of the runner's status sees it ready; the
  poll asks at once, then sleeps 250 ms between asks, so a load is seen at the first multiple
  of 250 ms at or after it finished (:func:`seen_at`; issue 34, third pass: the peer pays its
  poll as llama-swap and ``berth run`` pay theirs).
- **Runtime OOM** expires every runner on the card.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..world import LOADING, READY
from .base import SimPolicy

__all__ = ["KeepAlivePolicy", "seen_at"]

MAX_QUEUE = 512
HEADROOM = 0.8
RECOVERY_FRACTION = 0.75
RECOVERY_POLL_S = 0.25
RECOVERY_TIMEOUT_S = 5.0
RESCHED_DELAY_S = 0.25
MODELS_PER_GPU = 3           # defaultModelsPerGPU
READY_POLL_S = 0.25          # WaitUntilRunning's sleep between status asks


def seen_at(load_s: float) -> float:
    """Seconds after a runner's start when ``WaitUntilRunning`` first sees it ready, for a
    load that took ``load_s``: its asks go at 0, 0.25, 0.5, ... s."""
    return math.ceil(load_s / READY_POLL_S - 1e-9) * READY_POLL_S


@dataclass
class _Runner:
    proc: object
    keep_alive_s: float
    ref: int = 0
    expiring: bool = False
    unloading: bool = False
    timer: object = None
    recovery: tuple | None = None   # (free before, bytes expected back, progress)


class KeepAlivePolicy(SimPolicy):
    """Ollama-like keep-alive eviction; see the module docstring."""

    name = "keepalive-evict"

    def attach(self, world) -> None:
        super().attach(world)
        self.runners: dict[str, _Runner] = {}
        self.pending: deque = deque()
        self.blocked = False
        self.max_runners = MODELS_PER_GPU * len(world.wl.cards)
        self.recovery_timeouts = 0
        #: where the next load of each free engine goes (chosen by :meth:`place`)
        self.placed: dict[str, tuple[str, ...]] = {}

    def extra(self) -> dict:
        return {"vram_recovery_timeouts": self.recovery_timeouts}

    # -- requests ---------------------------------------------------------------------------
    def on_arrival(self, job) -> None:
        r = self.runners.get(job.engine)
        if r is not None and not r.expiring and r.proc.alive:
            self._use(r, job)
            return
        if len(self.pending) >= MAX_QUEUE:
            self.world.retry(job, 1.0, "503 server busy")
            return
        self.pending.append(job)
        self._kick()

    def on_leave(self, job) -> None:
        if job in self.pending:
            self.pending.remove(job)
            self._kick()

    def _use(self, r: _Runner, job) -> None:
        r.ref += 1
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        self.world.forward(job, r.proc)

    def on_job_end(self, job, ok: bool) -> None:
        r = self.runners.get(job.engine)
        if r is None:
            return
        r.ref -= 1
        if r.ref > 0:
            return
        if r.expiring:
            self._unload(r)
        elif r.proc.state in (LOADING, READY):
            r.timer = self.world.loop.after(r.keep_alive_s, self._expire, r)

    # -- the pending loop -------------------------------------------------------------------
    def _kick(self) -> None:
        """Steps (1)-(7) of the module docstring, for the queue's head, until it blocks."""
        w = self.world
        while self.pending and not self.blocked:
            job = self.pending[0]
            m = job.engine
            r = self.runners.get(m)
            if r is not None and not r.expiring and r.proc.alive:         # (1)
                self.pending.popleft()
                self._use(r, job)
                continue
            if r is not None:                                             # (2)
                self.blocked = True
                return
            spec = w.specs[m]
            if len(self.runners) >= self.max_runners:                     # (3)
                self._evict(spec)
                return
            if spec.free:
                cards = self.place(spec)
                spec = spec.on(cards) if cards is not None else spec
                self.placed[m] = spec.cards
                if not self.runners:                                      # (4) the first model
                    self._load(job)
                    continue
                if cards is not None:
                    self._load(job)
                    continue
                self._evict(spec)                                         # (7)
                return
            others = [o for o in self.runners.values() if set(o.proc.spec.cards) & set(spec.cards)]
            if not others:                                                # (4)
                self._load(job)
                continue
            if any(o.proc.state == LOADING for o in others):              # (5)
                self.pending.popleft()
                w.loop.after(RESCHED_DELAY_S, self._requeue, job)
                continue
            if self._fits(spec):                                          # (6)
                self._load(job)
                continue
            self._evict(spec)                                             # (7)
            return

    def _requeue(self, job) -> None:
        self.pending.append(job)
        self._kick()

    def _free(self, pci: str) -> int:
        """``updateFreeSpace``: the driver's free, or total less the runners' estimates if less."""
        predicted = sum(r.proc.spec.size_bytes.get(pci, 0) for r in self.runners.values())
        return min(self.world.free(pci), self.world.total[pci] - predicted)

    def place(self, spec) -> tuple[str, ...] | None:
        """``bestSingleGPUFit`` for each of the engine's cards: the cards where its per-card
        estimate is at most 80 % of free, the most free first; ``None`` when too few fit."""
        est = max(spec.size_bytes.values())
        ok = [p for p in self.world.total if est <= HEADROOM * self._free(p)]
        ok.sort(key=lambda p: -self._free(p))           # stable: card order breaks ties
        n = len(spec.cards)
        return tuple(ok[:n]) if len(ok) >= n else None

    def _fits(self, spec) -> bool:
        for p, est in spec.size_bytes.items():
            predicted = sum(r.proc.spec.size_bytes.get(p, 0) for r in self.runners.values())
            free = min(self.world.free(p), self.world.total[p] - predicted)
            if est > HEADROOM * free:
                return False
        return True

    def _load(self, job) -> None:
        self.pending.popleft()
        proc = self.world.load(job.engine, cards=self.placed.pop(job.engine, None), seen=seen_at)
        r = _Runner(proc, self.world.specs[job.engine].keep_alive_s)
        self.runners[job.engine] = r
        self._use(r, job)

    def _evict(self, spec) -> None:
        if spec.free:
            cands = list(self.runners.values())          # findRunnerToUnload: every runner
        else:
            cands = [r for r in self.runners.values()
                     if set(r.proc.spec.cards) & set(spec.cards)] or list(self.runners.values())
        cands.sort(key=lambda r: (r.keep_alive_s, r.proc.engine))
        victim = next((r for r in cands if r.ref == 0), cands[0])
        self.blocked = True
        self._expire(victim)

    # -- unloads ----------------------------------------------------------------------------
    def _expire(self, r: _Runner) -> None:
        if r.timer is not None:
            r.timer.cancel()
            r.timer = None
        r.expiring = True
        if r.ref <= 0:
            self._unload(r)

    def _unload(self, r: _Runner) -> None:
        if r.unloading:
            return
        r.unloading = True
        cards = r.proc.spec.cards
        before = sum(self.world.free(p) for p in cards)
        est = sum(r.proc.res.values())
        state = {"exited": not r.proc.alive, "recovered": False}
        r.recovery = (before, est, state)
        if r.proc.alive:
            self.world.stop(r.proc)
        start = self.world.now
        self.world.loop.after(RECOVERY_POLL_S, self._poll_recovery, r, start)

    def _poll_recovery(self, r: _Runner, start: float) -> None:
        before, est, state = r.recovery
        now = self.world.now
        freed = sum(self.world.free(p) for p in r.proc.spec.cards) - before
        if freed > RECOVERY_FRACTION * est:
            state["recovered"] = True
        elif now - start >= RECOVERY_TIMEOUT_S:
            state["recovered"] = True
            self.recovery_timeouts += 1
        if state["recovered"] and state["exited"]:
            self._unloaded(r)
        elif not state["recovered"]:
            self.world.loop.after(RECOVERY_POLL_S, self._poll_recovery, r, start)

    def on_exit(self, proc, crashed: bool) -> None:
        r = self.runners.get(proc.engine)
        if r is None or r.proc is not proc:
            return
        if crashed:
            # A runtime OOM expires every runner on the card; the dead one is simply gone,
            # and a later unload of it would wait the full 5 s for memory that never moves.
            for o in list(self.runners.values()):
                if o is not r and set(o.proc.spec.cards) & set(proc.spec.cards):
                    self._expire(o)
            if not r.unloading:
                r.expiring = True
                r.unloading = True
                r.recovery = (0, float("inf"), {"exited": True, "recovered": False})
                self.world.loop.after(RECOVERY_POLL_S, self._poll_recovery, r, self.world.now)
                return
        if r.unloading:
            r.recovery[2]["exited"] = True
            if r.recovery[2]["recovered"]:
                self._unloaded(r)

    def _unloaded(self, r: _Runner) -> None:
        if self.runners.get(r.proc.engine) is r:
            del self.runners[r.proc.engine]
        self.blocked = False
        self._kick()
