"""One machine: routing by model, a parked model woken by a request, reads that wake nothing
(issue 14 "Acceptance", first line)."""

from __future__ import annotations

from tests.berthd import wait_for
from tests.gateway.world import chat, http


def test_two_models_routed_to_their_fronts_and_a_parked_one_woken(machine):
    m = machine("solo")
    m.run("alpha", aliases=("org/alpha-7b",))
    m.run("beta", park=True)
    m.serving("alpha")
    m.serving("beta")
    m.gateway()

    for model, want in (("alpha", "alpha"), ("org/alpha-7b", "alpha"), ("beta", "beta")):
        code, doc, h = chat(m.port, model)
        assert code == 200, doc
        assert doc["model"] == want          # the stub answers with the model it serves
        assert h["X-Berth-Machine"] == "solo"

    # The board, served by the gateway too (issue 15), read from berthd over its socket.
    code, doc, h = http(m.port, "GET", "/board/")
    assert code == 200 and "default-src 'none'" in h["Content-Security-Policy"], (code, doc)
    assert 'src="static/page.js"' in doc["raw"]
    wait_for(lambda: any(le["engine"] == "alpha" for le in
                         (http(m.port, "GET", "/board/state")[1].get("board") or {})
                         .get("status", {}).get("leases", [])), 10, "the board to show alpha")
    assert http(m.port, "POST", "/board/operator/park", {"target": "alpha"},
                headers={"X-Berth-Board": "1"})[0] == 403          # no [board] key: read-only

    code, doc, _ = chat(m.port, "gamma")
    assert code == 404 and doc["src"] == "berth" and doc["reason"] == "model_not_found", doc
    assert doc["error"]["type"] and doc["error"]["code"] == 404
    code, doc, _ = http(m.port, "POST", "/v1/chat/completions", {"messages": []})
    assert code == 400 and doc["reason"] == "model_missing"
    # A model that is not a string is named as such (it read "must name the model" before).
    code, doc, _ = http(m.port, "POST", "/v1/chat/completions", {"model": 5, "messages": []})
    assert code == 400 and doc["reason"] == "model_invalid", doc
    assert "got 5" in doc["error"]["message"], doc

    # Park beta; /v1/models shows it parked, and reading it (again and again) wakes nothing.
    code, out = m.d.call("POST", "/v1/operator/park", {"target": "beta"})
    assert code == 200, out
    wait_for(lambda: m.d.state_of("beta") == "parked", 20, "beta parked")
    wait_for(lambda: m.models()["beta"]["berth"]["state"] == "parked", 10, "gateway sees parked")
    for _ in range(5):
        e = m.models()["beta"]
        assert e["berth"]["state"] == "parked"
        assert http(m.port, "GET", "/v1/models/beta")[1]["berth"]["state"] == "parked"
    assert m.d.state_of("beta") == "parked"
    assert not any(x["kind"] in ("resume", "wake") and x["engine"] == "beta"
                   for x in m.d.timeline()), "a read woke beta"
    models = m.models()
    assert models["alpha"]["berth"]["state"] == "active"
    assert "org/alpha-7b" in models["alpha"]["berth"]["aliases"]

    # A write for the parked model wakes it and is answered.
    code, doc, _ = chat(m.port, "beta")
    assert code == 200 and doc["model"] == "beta", doc
    assert m.d.state_of("beta") == "active"


    # berthd measured the switches it saw, and the gateway lists them per machine.
    costs = m.d.status()["switch_costs"]["beta"]
    assert costs["park_s"] > 0 and costs["restore_s"] > 0 and costs["cold_start_s"] > 0, costs
    assert costs["samples"] == {"park_s": 1, "restore_s": 1, "cold_start_s": 1}
    wait_for(lambda: (m.models()["beta"]["berth"]["machines"][0]["switch_costs"] or {})
             .get("restore_s"), 10, "gateway lists beta's switch costs")
    assert m.models()["_machines"][0]["switch_costs"]["beta"]["park_s"] == costs["park_s"]
