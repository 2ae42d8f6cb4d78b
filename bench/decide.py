"""Time Berth's decisions: admission per waiter, and a ladder plan, at scale.

8 cards, 1,000 leases holding memory and 10,000 waiters. Prints the median and p99 microseconds
per admission decision (a waiter's need recomputed and a verdict on each of its cards) and per
ladder plan (the first 2,000 waiters, on cards the holders fill, so a plan must pick victims),
plus one full admission pass over the queue.
Targets (issue 2): admission median ≤ 20 µs, plan p99 ≤ 2,000 µs.

    python bench/decide.py [--json] [--seed N]

With ``--json`` the last line is one JSON object with keys ``admit_us_median``,
``admit_us_p99``, ``plan_us_median``, ``plan_us_p99``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from berth.decide.admission import (
    Policy,
    Queue,
    Waiter,
    WaitKind,
    admission_pass,
    verdict,
    waiter_need,
)
from berth.decide.ladder import plan
from berth.decide.ledger import Ledger
from berth.decide.model import Capabilities, Card, Lease, ParkMechanism, Share, ShareState

GiB = 1 << 30
N_CARDS, N_LEASES, N_WAITERS = 8, 1_000, 10_000


def build(seed: int) -> tuple[Ledger, Queue, Policy]:
    rng = random.Random(seed)
    led = Ledger()
    pcis = [f"0000:{i + 1:02x}:00.0" for i in range(N_CARDS)]
    for i, p in enumerate(pcis):
        led.add_card(Card(p, f"gpu{i}", 1024 * GiB, reserve_bytes=GiB, free_bytes=1024 * GiB))
    now = 1000.0
    for i in range(N_LEASES):
        k = 1 if rng.random() < 0.9 else rng.randint(2, 4)
        cards = rng.sample(pcis, k)
        size = rng.randint(1, 7) * GiB // 8 * 7
        park = rng.choice([None, ParkMechanism.CHECKPOINT, ParkMechanism.HOOK])
        lease = Lease(f"h{i}", f"e{i % 300}", {p: Share(p, size) for p in cards},
                      priority=rng.randint(0, 3), granted_at=now - rng.uniform(0, 600),
                      last_used_at=now - rng.uniform(0, 600),
                      caps=Capabilities(park=park, lend=rng.random() < 0.2,
                                        front="127.0.0.1:1" if park else None))
        led.add_lease(lease)
        for p in cards:
            led.move(lease.id, p, ShareState.ACTIVE, now - 600, reserved_bytes=size)
    # Full cards: the holders leave 2 GiB, so most waiters do not fit and a plan must choose
    # victims among about 125 holders per card (priority, minimum turn, LRU, park or drain).
    for p in pcis:
        card = led.cards[p]
        card.total_bytes = led.counted(p) + card.reserve_bytes + 2 * GiB
        card.free_bytes = card.total_bytes - led.counted(p)
    q = Queue()
    for i in range(N_WAITERS):
        k = 1 if rng.random() < 0.9 else rng.randint(2, 3)
        cards = rng.sample(pcis, k)
        lease = Lease(f"w{i}", f"e{i % 300}", {p: Share(p, rng.randint(1, 40) * GiB) for p in cards},
                      priority=rng.randint(0, 5))
        led.add_lease(lease)
        q.push(Waiter(lease.id, WaitKind.GRANT, lease.priority, now + i * 1e-3, {}))
    return led, q, Policy(min_turn_s=30)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    led, q, policy = build(args.seed)
    now = 1000.0 + N_WAITERS * 1e-3
    clock = time.perf_counter

    admit_us: list[float] = []
    for w in q:
        t0 = clock()
        need = waiter_need(led, w)
        for p, b in need.items():
            verdict(led, p, b, w.lease_id)
        admit_us.append((clock() - t0) * 1e6)

    plan_us: list[float] = []
    results = {"plan": 0, "noplan": 0, "steps": 0}
    for w in list(q)[:2000]:
        t0 = clock()
        r = plan(led, w, policy, now)
        plan_us.append((clock() - t0) * 1e6)
        results["plan" if hasattr(r, "steps") else "noplan"] += 1
        results["steps"] += len(getattr(r, "steps", ()))

    t0 = clock()
    admission_pass(led, q, policy, now)
    pass_ms = (clock() - t0) * 1e3

    out = {"admit_us_median": round(statistics.median(admit_us), 2),
           "admit_us_p99": round(pct(admit_us, 0.99), 2),
           "plan_us_median": round(statistics.median(plan_us), 1),
           "plan_us_p99": round(pct(plan_us, 0.99), 1),
           "pass_ms_10k_waiters": round(pass_ms, 1),
           "targets": {"admit_us_median": 20, "plan_us_p99": 2000}}
    print(f"{N_CARDS} cards, {N_LEASES} leases, {N_WAITERS} waiters")
    print(f"admission decision: median {out['admit_us_median']} µs, p99 {out['admit_us_p99']} µs "
          f"(target median ≤ 20 µs: ratio {out['admit_us_median'] / 20:.2f})")
    print(f"ladder plan ({len(plan_us)} waiters on full cards: {results['plan']} plans with "
          f"{results['steps']} steps, {results['noplan']} no-plan): median "
          f"{out['plan_us_median']} µs, "
          f"p99 {out['plan_us_p99']} µs (target p99 ≤ 2000 µs: ratio "
          f"{out['plan_us_p99'] / 2000:.2f})")
    print(f"one admission pass over {N_WAITERS} waiters: {out['pass_ms_10k_waiters']} ms")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
