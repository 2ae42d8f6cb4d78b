"""What to measure (seed 000 "Measuring whether the policy works").

- waits begun while some memory stood free above the watermark, not enough for the waiter, and
  nothing was done to make room (too conservative when it climbs; a higher-priority holder's
  waiter counts once): ``admissions_rejected_with_free``, worded :data:`REJECTED_WITH_FREE_WORDS`;
- preemptions by kind, and fallbacks to drain (too aggressive);
- the reserve as a fraction of the cards (paying throughput for a guarantee);
- a suggested minimum reserve: the growth between two driver reads plus the largest single step
  seen (seed 000 "The watermark": it "must exceed Bc plus the largest single allocation a step
  can demand"), flagged when the configured reserve is below it. Growth here is what no
  admission counted: a share counts its whole reservation, so a load or a KV cache growing
  inside it (or after an extension) takes nothing from the reserve; only use past the
  reservation does. A holder's steps are forgotten with it, and the suggestion never passes
  what the card could hold with no reserve at all.

Pure: times are arguments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# REJECTED_WITH_FREE_WORDS's home is .kinds, which `berth status` reads without this module.
from .kinds import REJECTED_WITH_FREE_WORDS
from .ledger import Ledger

__all__ = ["Counters", "GrowthMeter", "REJECTED_WITH_FREE_WORDS", "reserve_fraction",
           "suggested_reserve"]


@dataclass
class Counters:
    """Monotonic event counts since the broker started (or since the state it re-attached)."""

    admissions_rejected_with_free: int = 0
    grants: int = 0
    parks: int = 0
    checkpoints: int = 0
    lends: int = 0
    returns: int = 0
    drains: int = 0
    fallbacks_to_drain: int = 0
    wakes: int = 0
    unparked: int = 0
    extensions: int = 0
    rejected_never: int = 0
    moves: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class GrowthMeter:
    """Growth of each holder's uncounted use (bytes past its reservation) between driver
    reads, in bytes and bytes per second, keyed ``(lease id, PCI)``.

    ``rate_bps`` is an exponentially weighted mean of positive growth rates (weight ``alpha``);
    ``max_step_bytes`` the largest growth seen between two consecutive reads.
    """

    alpha: float = 0.3
    last: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    rate_bps: dict[tuple[str, str], float] = field(default_factory=dict)
    max_step_bytes: dict[tuple[str, str], int] = field(default_factory=dict)

    def record(self, lease_id: str, pci: str, used_bytes: int, now: float) -> None:
        key = (lease_id, pci)
        prev = self.last.get(key)
        self.last[key] = (used_bytes, now)
        if prev is None or now <= prev[1]:
            return
        step = used_bytes - prev[0]
        if step > 0:
            self.max_step_bytes[key] = max(self.max_step_bytes.get(key, 0), step)
        rate = max(0.0, step / (now - prev[1]))
        old = self.rate_bps.get(key)
        self.rate_bps[key] = rate if old is None else self.alpha * rate + (1 - self.alpha) * old

    def reset(self, lease_id: str, pci: str) -> None:
        """Start over for one share: the next read is a baseline, not a step (a load or a
        restore is not growth)."""
        self.last.pop((lease_id, pci), None)

    def forget(self, lease_id: str) -> None:
        for table in (self.last, self.rate_bps, self.max_step_bytes):
            for key in [k for k in table if k[0] == lease_id]:
                del table[key]


def reserve_fraction(ledger: Ledger) -> float:
    """Σ reserve / Σ total over all cards (0.0 with no cards)."""
    total = sum(c.total_bytes for c in ledger.cards.values())
    return sum(c.reserve_bytes for c in ledger.cards.values()) / total if total else 0.0


def suggested_reserve(ledger: Ledger, meter: GrowthMeter, read_interval_s: float) -> dict[str, dict]:
    """Per card: ``{"suggested_bytes", "reserve_bytes", "below"}`` (bytes).

    suggested = Σ over holders on the card of (growth rate × read interval) + the largest single
    step of a holder on the card, at most what the card holds less its baseline and claims.
    ``below`` is true when the configured reserve is smaller.
    """
    out: dict[str, dict] = {}
    for pci, card in ledger.cards.items():
        growth = sum(r for (lid, p), r in meter.rate_bps.items() if p == pci and lid in ledger.leases)
        step = max((n for (lid, p), n in meter.max_step_bytes.items()
                    if p == pci and lid in ledger.leases), default=0)
        bound = max(0, card.total_bytes - card.baseline_bytes - card.claim_bytes)
        suggested = min(bound, int(growth * read_interval_s) + step)
        out[pci] = {"suggested_bytes": suggested, "reserve_bytes": card.reserve_bytes,
                    "below": card.reserve_bytes < suggested}
    return out
