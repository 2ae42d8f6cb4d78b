"""What one run measured, and the table that compares runs.

Measures (seed 000 "Measuring whether the policy works", and the issue's list):

- **wait**: seconds from a request's first arrival to the start of the attempt that completed
  (its first byte). A request still unserved at the horizon counts with its wait so far, so
  the percentiles never flatter a policy that strands requests. One whose client left counts
  until it left; one answered at once with a 503 naming why (Berth's front, when nothing under
  way can give its engine the card) until that answer (``refused_at_once``).
- **switches by kind**: ``load`` (cold start or reload), ``drain`` (a graceful stop),
  ``park`` (checkpoint to host RAM), ``wake`` (restore), ``lend``/``return``, ``crash`` (an
  engine killed by an OOM).
- **bytes moved**: what the mechanisms copied: weights read by loads, memory checkpointed out
  and restored in.
- **OOM events**: allocations that would have taken a card's use past its total (from the
  simulated driver, :mod:`.world`).
- **rejected with free**: starts (a cold load or a wake) that a policy did not make at once
  although the card's free bytes above the policy's floor covered the engine's current need.
  Berth runs also report the core's own counter (``berth_rejected_with_free``).
- **reserve fraction**: the floor the policy keeps free, as a fraction of all cards' memory.
- **each request's wait by name** (``request_waits``, issue 34's third pass): ``{key: [engine,
  wait_s]}``, the key ``r<i>`` for the trace's i-th open-loop request and ``c<client>.<n>`` for a
  closed-loop client's n-th, which is the same request (engine, service, think time) under
  every policy; :mod:`.verdict` compares two runs over the keys both have.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

__all__ = ["Recorder", "percentiles", "table", "SWITCH_KINDS", "request_key"]

SWITCH_KINDS = ("load", "drain", "park", "wake", "lend", "return", "crash")


def percentiles(values, qs=(50, 95, 99)) -> list[float]:
    """Percentiles of ``values`` (linear interpolation); zeros for an empty list."""
    if len(values) == 0:
        return [0.0 for _ in qs]
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), qs)]


def request_key(job, nth: int | None) -> str:
    """The name of ``job`` that is the same under every policy: ``r<i>`` for an open-loop
    request (its index in the trace), ``c<client>.<nth>`` for a closed-loop client's
    ``nth`` request (0-based)."""
    return f"r{job.id}" if job.client is None else f"c{job.client}.{nth}"


class Recorder:
    """Counters and samples of one run (one workload under one policy)."""

    def __init__(self, wl, policy_name: str):
        self.workload, self.policy = wl.name, policy_name
        self.engines = [e.name for e in wl.engines]
        self.cards = [c.pci for c in wl.cards]
        self.card_total = {c.pci: c.total_bytes for c in wl.cards}
        self.card_name = {c.pci: c.name for c in wl.cards}
        #: loads per engine per set of cards (names joined by '+'; issue 25: placement)
        self.placements: dict[str, Counter[str]] = {e: Counter() for e in self.engines}
        self.switches: Counter[str] = Counter()
        self.bytes_moved: Counter[str] = Counter()
        self.ooms: list[tuple[float, str, str, int, int]] = []
        self.rejected_with_free = 0
        self.failed_attempts = 0
        self.refusals: Counter[str] = Counter()
        self.times: list[float] = []
        self.card_used: dict[str, list[int]] = {p: [] for p in self.cards}
        self.engine_res: dict[str, list[int]] = {e: [] for e in self.engines}
        self.host_ram_peak_bytes = 0
        self.waits: list[float] = []
        self.waits_by_engine: dict[str, list[float]] = {e: [] for e in self.engines}
        self.summary: dict = {}

    def switch(self, kind: str, n_bytes: int) -> None:
        self.switches[kind] += 1
        self.bytes_moved[kind] += n_bytes

    def placed(self, engine: str, cards: tuple[str, ...]) -> None:
        """A load of ``engine`` on ``cards`` (PCI addresses), or a wake restored there from
        others (issue 35)."""
        self.placements[engine]["+".join(sorted(self.card_name[p] for p in cards))] += 1

    def oom(self, now: float, pci: str, engine: str, used: int, asked: int) -> None:
        self.ooms.append((now, pci, engine, used, asked))

    def sample(self, now: float, used: dict[str, int], by_engine: dict[str, int],
               host_ram: int) -> None:
        self.times.append(now)
        for p in self.cards:
            self.card_used[p].append(used[p])
        for e in self.engines:
            self.engine_res[e].append(by_engine[e])
        self.host_ram_peak_bytes = max(self.host_ram_peak_bytes, host_ram)

    def finish(self, jobs, end_s: float, policy) -> None:
        """Compute :attr:`summary` once the run is over."""
        unserved = dropped = left = refused = 0
        sent: Counter[int] = Counter()
        by_request: dict[str, list] = {}
        for j in jobs:
            if j.done_s is not None:
                w = j.wait_s
            elif j.answered_s is not None:
                # Its client left, or got a 503 at once: it waited until then.
                w = j.answered_s - j.arrival_s
                dropped += 1
                left += j.dropped == "client left"
                refused += j.dropped.startswith("refused")
            else:
                w = end_s - j.arrival_s
                if j.dropped:
                    dropped += 1
                else:
                    unserved += 1
            self.waits.append(w)
            self.waits_by_engine[j.engine].append(w)
            nth = None
            if j.client is not None:
                nth, sent[j.client] = sent[j.client], sent[j.client] + 1
            by_request[request_key(j, nth)] = [j.engine, round(w, 3)]
        p50, p95, p99 = percentiles(self.waits)
        free = [sum(self.card_total[p] - self.card_used[p][i] for p in self.cards)
                for i in range(len(self.times))]
        total = sum(self.card_total.values())
        self.summary = {
            "p50_wait_s": round(p50, 3), "p95_wait_s": round(p95, 3), "p99_wait_s": round(p99, 3),
            "mean_wait_s": round(float(np.mean(self.waits)) if self.waits else 0.0, 3),
            "max_wait_s": round(max(self.waits, default=0.0), 3),
            "requests": len(jobs), "unserved": unserved, "dropped": dropped,
            "left": left, "refused_at_once": refused,
            "answered": sum(1 for j in jobs if j.done_s is not None),
            "failed_attempts": self.failed_attempts,
            "refusals": dict(self.refusals),
            "switches": sum(self.switches.values()),
            "switches_by_kind": {k: self.switches.get(k, 0) for k in SWITCH_KINDS},
            "bytes_moved": sum(self.bytes_moved.values()),
            "bytes_moved_by_kind": {k: v for k, v in self.bytes_moved.items() if v},
            "oom_events": len(self.ooms),
            "oom_by_engine": dict(Counter(o[2] for o in self.ooms)),
            "rejected_with_free": self.rejected_with_free,
            "reserve_fraction": round(policy.reserve_fraction(), 4),
            "mean_free_fraction": round(float(np.mean(free)) / total, 4) if free else 1.0,
            "host_ram_peak_bytes": self.host_ram_peak_bytes,
            "p95_wait_by_engine_s": {e: round(percentiles(w)[1], 3)
                                     for e, w in self.waits_by_engine.items()},
            "end_s": round(end_s, 3),
            "cards_by_engine": {e: dict(c.most_common()) for e, c in self.placements.items()},
            "request_waits": by_request,
        }
        self.summary.update(policy.extra())


def cards_table(rows: list[tuple[str, str, dict]]) -> str:
    """A Markdown table of each engine's cards per ``(workload, policy)`` row: the sets of
    cards it was loaded on, with how many loads on each (issue 25)."""
    out = ["| workload | policy | engines' cards (loads, and wakes restored onto another card) |", "|---|---|---|"]
    for wl, pol, s in rows:
        cells = []
        for e, by in s.get("cards_by_engine", {}).items():
            cells.append(f"{e}: " + ", ".join(f"{c} ({n})" for c, n in by.items())
                         if by else f"{e}: -")
        out.append(f"| {wl} | {pol} | {'; '.join(cells)} |")
    return "\n".join(out)


def table(rows: list[tuple[str, str, dict]]) -> str:
    """A Markdown table of ``(workload, policy, summary)`` rows."""
    head = ("| workload | policy | p50 s | p95 s | p99 s | loads | drains | parks | wakes | "
            "crashes | GB moved | OOM | rej. w/ free | reserve | unserved |")
    out = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for wl, pol, s in rows:
        k = s["switches_by_kind"]
        out.append(
            f"| {wl} | {pol} | {s['p50_wait_s']:.1f} | {s['p95_wait_s']:.1f} | "
            f"{s['p99_wait_s']:.1f} | {k['load']} | {k['drain']} | {k['park']} | {k['wake']} | "
            f"{k['crash']} | {s['bytes_moved'] / 1e9:.0f} | {s['oom_events']} | "
            f"{s['rejected_with_free']} | {s['reserve_fraction']:.3f} | "
            f"{s['unserved'] + s['dropped']} |")
    return "\n".join(out)
