"""Prometheus metrics for berthd: figures read from the board at scrape time, so ``/metrics``
gives the same numbers as ``/v1/status`` (sizes in bytes, counters as totals).

Source: issue 4 "The control API" (``GET /metrics``).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from berth.daemon.broker import Broker

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


async def metrics(request: web.Request) -> web.Response:
    reg = request.app[REGISTRY]
    return web.Response(body=generate_latest(reg), content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus": "0.0.4"})



def registry(broker: Broker) -> CollectorRegistry:
    """A registry whose one collector reads ``broker``'s board at each scrape."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_BoardCollector(broker))
    return reg
