"""Prometheus metrics for berthd: figures read from the board at scrape time, so ``/metrics``
gives the same numbers as ``/v1/status`` (sizes in bytes, counters as totals).

Source: issue 4 "The control API" (``GET /metrics``).
"""

from __future__ import annotations

from aiohttp import web
from berth.daemon.broker import Broker
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = ["REGISTRY", "metrics", "registry"]

REGISTRY = web.AppKey("registry", CollectorRegistry)


class _BoardCollector:
    """Prometheus figures read from the board at scrape time (same numbers as the status)."""

    def __init__(self, broker: Broker):
        self.broker = broker

    def collect(self):
        st = self.broker.status()
        fields = ("total_bytes", "free_bytes", "reserve_bytes", "baseline_bytes",
                  "stowaway_bytes", "claim_bytes", "budget_bytes", "counted_bytes",
                  "available_bytes", "suggested_reserve_bytes")
        for f in fields:
            g = GaugeMetricFamily(f"berth_card_{f}", f"Card {f.replace('_', ' ')}",
                                  labels=["pci", "card"])
            for c in st["cards"]:
                if c.get(f) is not None:
                    g.add_metric([c["pci"], c["name"]], c[f])
            yield g
        shares = GaugeMetricFamily("berth_shares", "Shares by card and state",
                                   labels=["card", "state"])
        counts: dict[tuple[str, str], int] = {}
        for le in st["leases"]:
            for sh in le["shares"]:
                k = (sh["card_name"], sh["state"])
                counts[k] = counts.get(k, 0) + 1
        for (card, state), n in sorted(counts.items()):
            shares.add_metric([card, state], n)
        yield shares
        yield GaugeMetricFamily("berth_waiting", "Entries in the waiting queue",
                                value=len(st["waiting"]))
        for k, v in st["counters"].items():
            if k == "reserve_fraction":
                yield GaugeMetricFamily("berth_reserve_fraction", "Reserve / total", value=v)
            else:
                c = CounterMetricFamily(f"berth_{k}", f"Count of {k.replace('_', ' ')}")
                c.add_metric([], v)
                yield c
        kept = getattr(self.broker, "costs", None)      # issue 14's measured switch costs
        costs = st.get("switch_costs") or (kept.as_json() if kept is not None else {})
        if costs:
            g = GaugeMetricFamily("berth_switch_seconds", "Measured switch time per engine "
                                  "(median of the last samples), seconds", labels=["engine", "switch"])
            for engine, c in sorted(costs.items()):
                for k, v in c.items():
                    if k.endswith("_s") and v is not None:
                        g.add_metric([engine, k[:-2]], v)
            yield g


class _WaitCollector:
    """The wait-time histogram (``berth_wait_seconds``, by what was waited for: ``grant`` or
    ``resume``), from the board's :class:`~berth.daemon.board_web.WaitTimes` (issue 15)."""

    def __init__(self, waits):
        self.waits = waits

    def collect(self):
        h = HistogramMetricFamily("berth_wait_seconds", "Time from a request (or a wake) to its "
                                  "grant (or resume), seconds", labels=["kind"])
        w = self.waits
        for kind, counts in w.counts.items():
            acc, buckets = 0, []
            for b, n in zip((*w.buckets, float("inf")), counts, strict=True):
                acc += n
                buckets.append(("+Inf" if b == float("inf") else repr(float(b)), acc))
            h.add_metric([kind], buckets, round(w.sums[kind], 6))
        yield h


async def metrics(request: web.Request) -> web.Response:
    reg = request.app[REGISTRY]
    return web.Response(body=generate_latest(reg), content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus": "0.0.4"})



def registry(broker: Broker, waits=None) -> CollectorRegistry:
    """A registry whose collector reads ``broker``'s board at each scrape, and with ``waits``
    (the board's :class:`~berth.daemon.board_web.WaitTimes`) the wait-time histogram."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_BoardCollector(broker))
    if waits is not None:
        reg.register(_WaitCollector(waits))
    return reg
