"""Prometheus metrics for berthd: figures read from the board at scrape time, so ``/metrics``
gives the same numbers as ``/v1/status`` (sizes in bytes, counters as totals). berthd loads
this module at the first scrape (:mod:`berth.daemon.api_scrape`; issue 38).

Source: issue 4 "The control API" (``GET /metrics``).
"""

from __future__ import annotations

from berth.daemon.broker import Broker
from berth.decide.measures import REJECTED_WITH_FREE_WORDS
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

#: Counters whose name alone misleads: their help says what they count.
_HELP = {"admissions_rejected_with_free":
         f"Waits begun with some memory free above the reserve, not enough for the waiter, and "
         f"no room being made ({REJECTED_WITH_FREE_WORDS}); each waiter counts once"}

__all__ = ["registry"]


def _drained(drained: list[dict]):
    """Runs whose engine was drained and whose front stays (issue 35), and their waiters."""
    yield GaugeMetricFamily("berth_drained", "Runs whose engine is drained, their front kept",
                            value=len(drained))
    g = GaugeMetricFamily("berth_drained_waiters", "Requests held by a drained run's front",
                          labels=["engine"])
    for r in drained:
        g.add_metric([r["engine"]], r["waiters"])
    yield g


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
        yield from _lease_figures(st)
        yield _engines_up(st, set(getattr(self.broker, "engines", {}).values()))
        yield GaugeMetricFamily("berth_waiting", "Entries in the waiting queue",
                                value=len(st["waiting"]))
        yield from _drained(st.get("drained") or [])
        for k, v in st["counters"].items():
            if k == "reserve_fraction":
                yield GaugeMetricFamily("berth_reserve_fraction", "Reserve / total", value=v)
            else:
                c = CounterMetricFamily(f"berth_{k}", _HELP.get(k, f"Count of {k.replace('_', ' ')}"))
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


def _lease_figures(st: dict):
    """Each share's figures by engine, lease and card (issue 37: the board, ``berth status``
    and the metrics say the same size): ``berth_share_size_bytes`` (the lease's size; a ceiling
    when ``bound`` is not ``declared``), ``_counted_bytes``, ``_used_bytes`` (the last driver
    read), ``_peak_bytes`` (its high-water mark), and ``berth_share_state`` (1 for the share's
    state: what a monitor reads instead of a health check that keeps llama-swap's readiness)."""
    labels = ["engine", "lease", "card"]
    fams = {k: GaugeMetricFamily(f"berth_share_{k}_bytes", text, labels=labels + (
        ["bound"] if k == "size" else []))
        for k, text in (("size", "The lease's size on the card (a ceiling unless the bound "
                                 "is declared), bytes"),
                        ("counted", "What the share counts on the card, bytes"),
                        ("used", "The share's use at the last driver read, bytes"),
                        ("peak", "The share's highest use read since its grant, bytes"))}
    state = GaugeMetricFamily("berth_share_state", "1 for each share's state",
                              labels=labels + ["state"])
    counted = {(sh["lease"], c["pci"]): sh["counted_bytes"] for c in st["cards"]
               for sh in c["shares"]}
    for le in st["leases"]:
        for sh in le["shares"]:
            key = [le["engine"], le["id"], sh["card_name"]]
            fams["size"].add_metric(key + [le["bound"]], sh["size_bytes"])
            fams["counted"].add_metric(key, counted.get((le["id"], sh["card"]), 0))
            if sh["used_bytes"] is not None:
                fams["used"].add_metric(key, sh["used_bytes"])
            if sh.get("peak_bytes"):
                fams["peak"].add_metric(key, sh["peak_bytes"])
            state.add_metric(key + [sh["state"]], 1)
    yield from fams.values()
    yield state


def _engines_up(st: dict, seen: set[str]) -> GaugeMetricFamily:
    """``berth_engine_up{engine, state}``: 1 for an engine whose lease is active and serving,
    0 otherwise, with its state (``parked``, ``waiting``, …, or ``stopped`` for an engine
    berthd saw whose lease ended: a drained one). A front's health check answers 200 while
    its engine sleeps (llama-swap's readiness); a monitor reads this (issue 37)."""
    g = GaugeMetricFamily("berth_engine_up", "1 when the engine's lease is active and serving "
                          "(0: parked, waiting, stopped, ...)", labels=["engine", "state"])
    live: dict[str, tuple[int, str]] = {}
    for le in st["leases"]:
        states = sorted({sh["state"] for sh in le["shares"]})
        up = int(states == ["active"] and bool(le.get("ready")))
        if le["engine"] not in live or up:
            live[le["engine"]] = (up, "/".join(states) or "waiting")
    for engine in sorted(seen | set(live)):
        up, state = live.get(engine, (0, "stopped"))
        g.add_metric([engine, state], up)
    return g


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





def registry(broker: Broker, waits=None) -> CollectorRegistry:
    """A registry whose collector reads ``broker``'s board at each scrape, and with ``waits``
    (the board's :class:`~berth.daemon.board_web.WaitTimes`) the wait-time histogram."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_BoardCollector(broker))
    if waits is not None:
        reg.register(_WaitCollector(waits))
    return reg
