"""Real machines on loopback (berthd, ``berth run``, ``berth gateway`` processes): the right
machine first, stopped known from unknown, and the surfaces people look for (issue 27)."""

from __future__ import annotations

import re
import time

from tests.berthd import wait_for
from tests.gateway.world import chat, free_port, http


def _serving_on(m, model: str, machine: str, state: str) -> bool:
    e = m.models().get(model) or {}
    return any(x["machine"] == machine and x["state"] == state and x["up"]
               for x in e.get("berth", {}).get("machines", []))


def test_a_model_loading_here_and_ready_on_a_peer_goes_to_the_peer(machine):
    pa, pb = free_port(), free_port()
    a = machine("A", port=pa, peers=[pb])
    b = machine("B", port=pb, peers=[pa])
    a.run("m", load_s=120)          # its lease is granted; the engine loads for two minutes
    b.run("m")
    b.serving("m")
    wait_for(lambda: (a.d.lease_of("m") or {}).get("shares") and
             a.d.state_of("m") == "active", 30, "m granted on A")
    a.gateway()
    b.gateway()
    wait_for(lambda: _serving_on(a, "m", "A", "loading") and _serving_on(a, "m", "B", "active"),
             20, "A to see m loading here and active on B")
    t0 = time.monotonic()
    code, doc, h = chat(a.port, "m")
    assert code == 200 and h["X-Berth-Machine"] == "B", (code, doc)
    assert time.monotonic() - t0 < 10          # not the load's two minutes
    # The ranking's inputs are shown: in /v1/models and in the gateway's status JSON.
    e = a.models()["m"]["berth"]
    assert e["order"] == ["B", "A"] and e["machine"] == "B", e
    ranks = {x["machine"]: x["rank"] for x in e["machines"]}
    assert ranks["A"]["category"] == "loading" and ranks["B"]["category"] in ("ready_idle",
                                                                               "ready_busy")
    assert ranks["B"]["rtt_s"] > 0 and ranks["A"]["rtt_s"] == 0, ranks
    code, st, _ = http(a.port, "GET", "/berth/v1/gateway")
    assert [x["machine"] for x in st["ranking"]["m"]] == ["B", "A"], st["ranking"]
    assert {"category", "expected_s", "queue", "rtt_s", "loading_s"} <= set(st["ranking"]["m"][0])


def test_a_drained_engine_is_a_503_with_a_reason_and_only_an_unknown_name_a_404(machine):
    beta_front = free_port()
    m = machine("solo", extra=f'[engines.beta]\nfront = "127.0.0.1:{beta_front}"\n')
    # alpha's run exits on its drain (its front goes too); a run that keeps its front is
    # routed to it (tests/gateway/test_drained_front.py)
    m.run("alpha", "--exit-on-drain")
    m.run("beta", front=beta_front)
    m.serving("alpha")
    m.serving("beta")
    m.gateway()
    for name in ("alpha", "beta"):
        assert chat(m.port, name)[0] == 200
        code, out = m.d.call("POST", "/v1/operator/drain", {"target": name})
        assert code == 200, out
    wait_for(lambda: m.d.lease_of("alpha") is None and m.d.lease_of("beta") is None, 30,
             "both leases ended")
    wait_for(lambda: "alpha" not in m.models(), 10, "the gateway to see alpha gone")
    # alpha (a run with no entry) was a 404 "model_not_found": it is stopped, not unknown.
    code, doc, h = chat(m.port, "alpha")
    assert code == 503 and doc["reason"] == "engine_stopped", ("alpha", code, doc)
    assert int(h["Retry-After"]) >= 1 and "stopped" in doc["error"]["message"]
    # beta's entry names its front, which stays after the drain (issue 35): the request is
    # held there and its run starts the engine again.
    assert chat(m.port, "beta")[0] == 200
    code, doc, _ = chat(m.port, "gamma")
    assert code == 404 and doc["reason"] == "model_not_found", doc


def test_the_start_line_the_root_health_and_metrics(machine):
    m = machine("solo")
    m.run("alpha")
    m.serving("alpha")
    m.gateway()
    wait_for(lambda: (m.tmp / "gateway.log").read_text().count("listening on"), 10,
             "the start line")
    log = (m.tmp / "gateway.log").read_text()
    assert re.search(rf"^berth gateway: listening on http://127\.0\.0\.1:{m.port} "
                     rf"\(models: alpha\)$", log, re.M), log
    code, doc, h = http(m.port, "GET", "/")
    assert code == 302 and h["Location"] == "/board/", (code, h)
    code, doc, _ = http(m.port, "GET", "/health")
    assert code == 200 and doc["status"] == "ok" and doc["berthd"] is True, doc
    assert http(m.port, "HEAD", "/health")[0] == 200
    assert chat(m.port, "alpha")[0] == 200
    code, doc, h = http(m.port, "GET", "/metrics")
    text = doc["raw"]
    assert code == 200 and h["Content-Type"].startswith("text/plain"), (code, h)
    assert re.search(r'^berth_gateway_requests_total\{way="local"\} [1-9]', text, re.M), text
    assert 'berth_gateway_connections{listener="gateway"}' in text
    code, doc, h = http(m.port, "POST", "/metrics", {})
    assert code == 405 and h["Allow"] == "GET", (code, doc)     # read-only
