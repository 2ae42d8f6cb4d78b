"""What the gateway says about itself, read-only: ``/v1/models`` (every engine of every machine,
its state, switch costs and the inputs of its ranking), the gateway's status JSON
(``/berth/v1/gateway``), ``/health`` and ``/metrics`` (Prometheus' text format). Each is built
from the gateway's tables as they stand; nothing here asks berthd, a peer or an engine, so a
read never wakes anything (issue 14; issue 27 "Surfaces people look for").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from berth.gateway.choose import Candidate, rank
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from berth.gateway.server import Gateway

__all__ = ["models", "status", "health", "metrics", "candidates"]


def candidates(gw: "Gateway", model: str, local_only: bool = False
               ) -> tuple[list[Candidate], list]:
    """The machines that serve ``model``, best first, and the peers that serve it but are down
    (skipped). A route with no address to send to is no candidate."""
    cands: list[Candidate] = []
    r = gw.table.find(model)
    if r is not None and r.target:
        cands.append(Candidate(gw.machine, True, r.state, gw.table.queue(r),
                               gw.table.costs.get(r.name), r, 0.0, r.loading_s))
    down = []
    if not local_only and gw.peers is not None:
        for p, pr in gw.peers.candidates(model):
            if not pr.target:
                continue
            if not p.up:
                down.append(p)
                continue
            cands.append(Candidate(p.machine, False, pr.state, pr.queue, p.costs.get(pr.name),
                                   (p, pr), p.rtt_s or 0.0, pr.loading_s))
    return rank(cands), down


def _machines(gw: "Gateway") -> list[dict]:
    me = {"machine": gw.machine, "local": True, "up": True, "rtt_s": 0.0,
          "berthd": gw.table.berthd_up, "switch_costs": gw.table.costs}
    others = [{**p.as_dict(), "local": False} for p in gw.peers.peers] if gw.peers else []
    return [me, *others]


def _rows(gw: "Gateway") -> list[tuple[Candidate, bool, dict]]:
    """(candidate, up, route dict) for every engine of every machine."""
    rows = []
    for d in gw.table.snapshot():
        c = Candidate(gw.machine, True, d["state"], d["queue"],
                      gw.table.costs.get(d["name"]) or {}, d, 0.0, d["loading_s"])
        rows.append((c, True, d))
    for p in gw.peers.peers if gw.peers is not None else ():
        for r in p.routes:
            d = r.as_dict()
            c = Candidate(p.machine or p.url, False, d["state"], d["queue"],
                          p.costs.get(r.name) or {}, d, p.rtt_s or 0.0, d["loading_s"])
            rows.append((c, p.up, d))
    return rows


def _entries(gw: "Gateway") -> dict[str, dict]:
    by: dict[str, dict[str, Any]] = {}
    ranked: dict[str, list[Candidate]] = {}
    for c, up, d in _rows(gw):
        e = by.setdefault(d["name"], {"id": d["name"], "object": "model", "created": 0,
                                      "owned_by": "berth",
                                      "berth": {"aliases": [], "machines": []}})
        b = e["berth"]
        b["aliases"] = sorted(set(b["aliases"]) | set(d.get("aliases") or []))
        b["machines"].append({"machine": c.machine, "local": c.local, "up": up,
                              "state": d["state"] if up else "unreachable",
                              "queue": d["queue"], "switch_costs": c.costs,
                              "rank": c.as_dict() if up else None})
        if up and d.get("target"):
            ranked.setdefault(d["name"], []).append(c)
    for name, e in by.items():
        best = rank(ranked.get(name, []))
        e["berth"]["state"] = best[0].state if best else "unreachable"
        e["berth"]["machine"] = best[0].machine if best else None
        e["berth"]["order"] = [c.machine for c in best]
    return by


def models(gw: "Gateway") -> dict:
    """``GET /v1/models``: OpenAI's list, each entry with ``berth``: its aliases, the machines
    that serve it (state, queue, switch costs, ``rank``: the ranking inputs), the best one's
    state and machine, and the ``order`` requests try the machines in."""
    by = _entries(gw)
    return {"object": "list", "data": [by[k] for k in sorted(by)], "machines": _machines(gw)}


def model(gw: "Gateway", name: str) -> dict | None:
    """``GET /v1/models/{name}`` (a name or an alias), or None."""
    for e in _entries(gw).values():
        if e["id"] == name or name in e["berth"]["aliases"]:
            return e
    return None


def status(gw: "Gateway") -> dict:
    """``GET /berth/v1/gateway``: the machines, counters, requests in flight, the listeners'
    limits and counts, the ComfyUI port, and per model the ranked machines with their inputs."""
    ranking = {name: [{"machine": c.machine, **c.as_dict()} for c in
                      candidates(gw, name)[0]] for name in sorted({r.name for r in
                                                                   gw.table.routes})}
    return {"machine": gw.machine, "berthd": gw.table.berthd_up, "machines": _machines(gw),
            "served_local": gw.served_local, "forwarded": gw.forwarded, "refused": gw.refused,
            "in_flight": {k: v for k, v in gw.table.in_flight.items() if v},
            "ranking": ranking, "listeners": [_listener(x) for x in gw.listeners()],
            "relays": {"live": len(gw.relays.live), "gap_timeouts": gw.relays.gap_timeouts,
                       "peer_cuts": gw.relays.peer_cuts},
            "comfyui_port": gw.comfy.counters() if gw.comfy is not None else None}


def _listener(x) -> dict:
    return {"name": x.name, "port": x.port, "open": len(x.conns),
            "max_connections": x.max_connections, "accepted": x.accepted, "refused": x.refused,
            "evicted": x.evicted, "head_timeouts": x.head_timeouts,
            "idle_timeouts": x.idle_timeouts, "handed_off": x.handed_off}


def health(gw: "Gateway") -> dict:
    """``GET /health``: the gateway answers; whether berthd and the peers do."""
    peers = gw.peers.peers if gw.peers is not None else []
    return {"status": "ok", "machine": gw.machine, "berthd": gw.table.berthd_up,
            "peers_up": sum(p.up for p in peers), "peers": len(peers)}


class _Collector:
    def __init__(self, gw: "Gateway"):
        self.gw = gw

    def collect(self):
        gw = self.gw
        req = CounterMetricFamily("berth_gateway_requests", "requests routed, by way",
                                  labels=["way"])
        for way, n in (("local", gw.served_local), ("forwarded", gw.forwarded),
                       ("refused_peer_call", gw.refused)):
            req.add_metric([way], n)
        yield req
        inf = GaugeMetricFamily("berth_gateway_in_flight", "requests in flight to an engine "
                                "of this machine", labels=["engine"])
        for name, n in gw.table.in_flight.items():
            inf.add_metric([name], n)
        yield inf
        yield from _listener_metrics(gw.listeners())
        cut = CounterMetricFamily("berth_gateway_relays_cut", "answers ended by a limit",
                                  labels=["why"])
        cut.add_metric(["gap_timeout"], gw.relays.gap_timeouts)
        cut.add_metric(["peer_down"], gw.relays.peer_cuts)
        yield cut
        up = GaugeMetricFamily("berth_gateway_peer_up", "the peer answered its last poll",
                               labels=["peer"])
        rtt = GaugeMetricFamily("berth_gateway_peer_rtt_seconds", "smoothed round trip of the "
                                "peer's answers", labels=["peer"])
        for p in gw.peers.peers if gw.peers is not None else ():
            up.add_metric([p.machine or p.url], 1 if p.up else 0)
            if p.rtt_s is not None:
                rtt.add_metric([p.machine or p.url], p.rtt_s)
        yield up
        yield rtt


def _listener_metrics(listeners):
    opened = GaugeMetricFamily("berth_gateway_connections", "client connections open",
                               labels=["listener"])
    closed = CounterMetricFamily("berth_gateway_connections_closed", "client connections "
                                 "closed or refused by a limit", labels=["listener", "why"])
    for x in listeners:
        opened.add_metric([x.name], len(x.conns))
        for why in ("refused", "evicted", "head_timeouts", "idle_timeouts"):
            closed.add_metric([x.name, why], getattr(x, why))
    yield opened
    yield closed


def metrics(gw: "Gateway") -> bytes:
    """``GET /metrics``: the gateway's figures in Prometheus' text format."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(gw))
    return generate_latest(reg)
