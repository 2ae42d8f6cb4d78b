"""A fleet in simulation: Kubernetes' static GPU memory shares alone, against the same shares
with Berth on each node (issue 39; the design is docs/scale.md).

    python bench/fleet.py                 # 100 nodes of 4 cards (about 1.5 min of one core)
    python bench/fleet.py --nodes 10      # a smaller fleet (about 10 s)
    python bench/fleet.py --json          # last line: one JSON object with both sides and ratios

Every node is the policy simulator's ``b-four-cards`` (bench/policy: four 24 GiB cards, eight
engines, one of them spanning three cards), each node's trace drawn by ``gen.workload_b`` from
its own seed (node ``n``: seed ``1000 * (n + 1) + 1``, what ``gen.build_all(n + 1)`` gives b).
Each engine is a pod whose ResourceClaim asks its declared size (``capacity.requests.memory``,
KEP-5075) on as many cards as it spans. The two sides replay the same traces:

- ``k8s-static`` (:class:`StaticShares`): the scheduler's accounting is all there is. Pods are
  created in the trace's engine order; each is allocated the first cards of its node whose
  unallocated ``memory`` capacity (the card's total, as NVIDIA's driver publishes it) covers its
  share, and holds them for good: loaded at the start, never parked, never stopped, whether it
  serves or idles. A pod whose share fits nowhere on its node stays Pending; nothing it asked
  for is served (no node of this fleet has room to spare, every one being as full, so no other
  node would take it either). An OOM-killed pod restarts at once.
- ``k8s+berth``: the same pods, the same shares, on the same nodes, and on each node Berth as a
  new install configures it (the simulator's ``berth-default``: Berth's real pure core places,
  admits, parks, lends and drains), every pod at priority 0. The pods static shares leave
  Pending are on the node as the opportunistic tier (claims consuming no capacity in the
  scheduler's books, their size read by Berth; docs/scale.md "Two tiers"); ``--tiers`` also
  gives the guaranteed pods priority 1. In the scheduler's books each guaranteed share stays
  allocated while Berth parks its pod; Berth lends the bytes to the node's other pods
  (docs/scale.md "A park").

Measured per node, then over the fleet: each request's wait (arrival to first byte; a request
never served counts its wait until the run's horizon, the trace's hour plus a tail of
``--tail`` seconds, as bench/policy's metrics do), the fraction of card-time with no request
running on the card ("cards idle"), the requests never served, and OOM events from the
simulated driver. The ratios are Berth's figure over the static one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.policy.gen import workload_b  # noqa: E402
from bench.policy.policies import DEFAULT, make  # noqa: E402
from bench.policy.policies.base import SimPolicy  # noqa: E402
from bench.policy.world import LOADING, READY, World  # noqa: E402

__all__ = ["StaticShares", "FleetWorld", "run_node", "main", "node_seed"]

STATIC, BERTH = "k8s-static", "k8s+berth"


def node_seed(n: int) -> int:
    """The generator seed of node ``n`` (0-based): b-four-cards under ``build_all(n + 1)``."""
    return 1000 * (n + 1) + 1


def first_fit(wl) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """The scheduler's pass over one node: each engine's share (its declared size on each of
    its cards) on the first cards, in PCI order, whose unallocated capacity (the card's total)
    covers it, in the trace's engine order. Returns ``({engine: cards}, [pending engines])``."""
    left = {c.pci: c.total_bytes for c in wl.cards}
    placed: dict[str, tuple[str, ...]] = {}
    pending: list[str] = []
    for spec in wl.engines:
        sets = (itertools.combinations(sorted(left), len(spec.cards)) if spec.free
                else [spec.cards])
        size = max(spec.size_bytes.values())
        chosen = next((c for c in sets if all(left[p] >= size for p in c)), None)
        if chosen is None:
            pending.append(spec.name)
            continue
        for p in chosen:
            left[p] -= size
        placed[spec.name] = tuple(chosen)
    return placed, pending


class StaticShares(SimPolicy):
    """Kubernetes' static memory shares (module docstring, ``k8s-static``). ``pending``: the
    engines whose share fits on no set of their node's cards (:func:`first_fit`)."""

    name = STATIC

    def attach(self, world) -> None:
        super().attach(world)
        self.started = False
        self.cards, self.pending = first_fit(world.wl)
        self.held = {e: deque() for e in world.specs}

    def _allocate(self) -> None:
        """Every allocated pod starts at once and holds its share for good."""
        for e, cards in self.cards.items():
            self.world.load(e, cards=cards if self.world.specs[e].free else None)
        self.started = True

    def on_read(self, now: float) -> None:
        if not self.started:
            self._allocate()

    def on_arrival(self, job) -> None:
        if not self.started:
            self._allocate()
        if job.engine in self.pending:
            return                      # Pending: never served (counted until the horizon)
        proc = self.world.current[job.engine]
        if proc is not None and proc.state in (LOADING, READY):
            self.world.forward(job, proc)
        else:
            self.held[job.engine].append(job)

    def on_exit(self, proc, crashed: bool) -> None:
        e = proc.engine
        if e in self.cards and self.world.current[e] is proc:
            new = self.world.load(e, cards=self.cards[e] if proc.spec.free else None)
            while self.held[e]:
                self.world.forward(self.held[e].popleft(), new)

    def extra(self) -> dict:
        return {"pending": list(self.pending)}


class FleetWorld(World):
    """The simulator's world, also keeping when each card ran a request (for "cards idle")."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.busy: dict[str, list[tuple[float, float]]] = {p: [] for p in self.total}
        self._began: dict[int, tuple[float, tuple[str, ...]]] = {}

    def _start(self, job, proc) -> None:
        super()._start(job, proc)
        self._began[job.run_id] = (self.now, tuple(proc.spec.cards))

    def _ended(self, run_id: int) -> None:
        began = self._began.pop(run_id, None)
        if began is not None:
            for p in began[1]:
                self.busy[p].append((began[0], self.now))

    def _finish(self, job, run_id: int) -> None:
        if job.run_id == run_id and job.proc is not None:
            self._ended(run_id)
        super()._finish(job, run_id)

    def _fail(self, job) -> None:
        self._ended(job.run_id)
        super()._fail(job)

    def idle_fraction(self, until_s: float) -> float:
        """The fraction of card-time in ``[0, until_s]`` with no request running on the card."""
        busy = 0.0
        for spans in self.busy.values():
            end = 0.0
            for a, b in sorted(spans):
                a, b = max(a, end), min(b, until_s)
                if b > a:
                    busy += b - a
                    end = b
        return 1.0 - busy / (len(self.busy) * until_s)


def tiers(wl):
    """The workload as the Berth side runs it: the pods static shares allocate are the
    guaranteed tier (priority 1: their claims consume their share in the scheduler's books),
    the pods they leave Pending the opportunistic tier (priority 0: claims consuming no
    capacity, their size read by Berth; docs/scale.md "Two tiers")."""
    placed, _ = first_fit(wl)
    return replace(wl, engines=tuple(replace(e, priority=1) if e.name in placed else e
                                     for e in wl.engines))


def run_node(n: int, side: str, tail_s: float, two_tiers: bool = False) -> dict:
    """Replay node ``n``'s trace on one side; its waits (seconds), idle fraction, OOMs.
    ``two_tiers``: the Berth side runs the guaranteed pods at priority 1 (:func:`tiers`)."""
    wl = workload_b(node_seed(n))
    if side == BERTH and two_tiers:
        wl = tiers(wl)
    policy = StaticShares() if side == STATIC else make(DEFAULT)
    world = FleetWorld(wl, policy, tail_s=tail_s)
    rec = world.run()
    s = rec.summary
    return {"waits": rec.waits, "idle": world.idle_fraction(wl.duration_s),
            "oom": s["oom_events"], "unserved": s["unserved"] + s["dropped"],
            "requests": s["requests"], "pending": s.get("pending", [])}


def _side(nodes: list[dict]) -> dict:
    waits = np.concatenate([np.asarray(r["waits"], dtype=float) for r in nodes])
    waited = waits[waits > 1.0]
    pending = sorted({e for r in nodes for e in r["pending"]})
    return {"p50_wait_s": round(float(np.percentile(waits, 50)), 2),
            "p95_wait_s": round(float(np.percentile(waits, 95)), 2),
            "p99_wait_s": round(float(np.percentile(waits, 99)), 2),
            "requests": int(waits.size), "requests_waited_over_1s": int(waited.size),
            "unserved": sum(r["unserved"] for r in nodes),
            "cards_idle_fraction": round(float(np.mean([r["idle"] for r in nodes])), 4),
            "oom_events": sum(r["oom"] for r in nodes),
            "pods_pending": sum(len(r["pending"]) for r in nodes),
            "engines_pending": pending}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100,
                    help="nodes of 4 cards (default 100, the issue's fleet: about 1.5 minutes "
                         "of one core)")
    ap.add_argument("--tail", type=float, default=600.0,
                    help="seconds the run goes on past the trace's hour (default 600)")
    ap.add_argument("--tiers", action="store_true",
                    help="the Berth side with two tiers: the pods static shares allocate at "
                         "priority 1 (their requests then wait less, and an opportunistic "
                         "pod's request that nothing under way can serve is answered 503 at "
                         "once: counted never served, its wait until that answer)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    if args.nodes < 1:
        ap.error(f"--nodes: expected 1 or more, got {args.nodes}")
    t0 = time.process_time()
    sides = {}
    for side in (STATIC, BERTH):
        sides[side] = _side([run_node(n, side, args.tail, args.tiers)
                             for n in range(args.nodes)])
    s, b = sides[STATIC], sides[BERTH]
    ratios = {k: _ratio(b[k], s[k]) for k in
              ("p95_wait_s", "p50_wait_s", "requests_waited_over_1s", "unserved",
               "cards_idle_fraction")}
    out = {"nodes": args.nodes, "cards": 4 * args.nodes, "workload": "b-four-cards per node",
           "tail_s": args.tail, "berth_tiers": args.tiers, STATIC: s, BERTH: b, "ratios_berth_over_static": ratios,
           "cpu_s": round(time.process_time() - t0, 1)}
    print(f"fleet: {args.nodes} nodes x 4 cards of 24 GiB, b-four-cards per node (own seed), "
          f"{s['requests']} requests")
    print("| side | p50 s | p95 s | p99 s | waited >1 s | never served | cards idle | OOM | "
          "pods pending |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, v in sides.items():
        print(f"| {name} | {v['p50_wait_s']:.1f} | {v['p95_wait_s']:.1f} | "
              f"{v['p99_wait_s']:.1f} | {v['requests_waited_over_1s']} | {v['unserved']} | "
              f"{v['cards_idle_fraction']:.3f} | {v['oom_events']} | {v['pods_pending']} |")
    print("pending under static shares (every node): " + (", ".join(s["engines_pending"])
                                                          or "none"))
    print("ratios (Berth / static): " + ", ".join(
        f"{k} {v:.3g}" if v is not None else f"{k} n/a" for k, v in ratios.items()))
    print(f"{out['cpu_s']} s of CPU time")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
