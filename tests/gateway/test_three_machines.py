"""Three machines on loopback, each a berthd on its own simulated card and state directory with
its own gateway (issue 14 "Acceptance", second line; seed 002 "Many machines")."""

from __future__ import annotations

import json
import time

from berth.gateway.signing import sign

from tests.berthd import wait_for
from tests.gateway.world import KEY, chat, free_port, http
from tests.helpers import ceiling


def _sse(port: int, model: str) -> tuple[int, list[str], dict]:
    code, doc, h = chat(port, model, stream=True)
    lines = [ln[len("data: "):] for ln in doc.get("raw", "").splitlines() if ln.startswith("data: ")]
    return code, lines, h


def test_three_gateways(machine):
    ports = {n: free_port() for n in "ABC"}
    peers = {n: [ports[o] for o in "ABC" if o != n] for n in "ABC"}
    a = machine("A", port=ports["A"], peers=peers["A"])
    b = machine("B", port=ports["B"], peers=peers["B"])
    c = machine("C", port=ports["C"], peers=peers["C"])
    a.run("a-model")
    b.run("shared", park=True)
    c.run("shared", park=True)
    c.run("c-only", aliases=("org/c-only",))
    for m, e in ((a, "a-model"), (b, "shared"), (c, "shared"), (c, "c-only")):
        m.serving(e)
    code, out = b.d.call("POST", "/v1/operator/park", {"target": "shared"})
    assert code == 200, out
    wait_for(lambda: b.d.state_of("shared") == "parked", 20, "shared parked on B")
    for m in (a, b, c):
        m.gateway()

    def a_sees():
        ms = a.models()
        sh = {x["machine"]: x["state"] for x in ms.get("shared", {}).get("berth", {})
              .get("machines", [])}
        return "c-only" in ms and sh == {"B": "parked", "C": "active"}
    wait_for(a_sees, 15, "A to list B's and C's engines with their states")

    # A request to A for a model only C serves is answered by C; by alias too; streaming too.
    for model in ("c-only", "org/c-only"):
        code, doc, h = chat(a.port, model)
        assert code == 200 and doc["model"] == "c-only", doc
        assert h["X-Berth-Machine"] == "C"
    code, lines, h = _sse(a.port, "c-only")
    assert code == 200 and h["X-Berth-Machine"] == "C"
    assert lines[-1] == "[DONE]" and len(lines) >= 3, lines
    assert all(json.loads(x)["model"] == "c-only" for x in lines[:-1])
    # Leases never cross a machine: A's berthd holds none for C's model.
    assert a.d.lease_of("c-only") is None and b.d.lease_of("c-only") is None
    # A's own model stays on A.
    assert chat(a.port, "a-model")[2]["X-Berth-Machine"] == "A"

    # A model on both B and C goes to the one that has it awake (C; B has it parked), and the
    # choice woke nothing on B.
    for _ in range(3):
        code, doc, h = chat(a.port, "shared")
        assert code == 200 and h["X-Berth-Machine"] == "C", (code, doc, h)
    assert b.d.state_of("shared") == "parked"

    # Signed with a wrong key, or replayed outside the window: refused, nothing served.
    path = "/v1/chat/completions"
    body = json.dumps({"model": "c-only", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    for headers, reason in (
            (sign("w" * 32, "A", "POST", path, body, to="C"), "bad_signature"),
            (sign(KEY, "A", "POST", path, body, to="C", now=time.time() - 120), "stale"),
            (sign(KEY, "A", "POST", path, b"{}", to="C"), "bad_signature"),      # body changed
            # signed for B, sent to C (issue 26: a call could be sent to another peer)
            (sign(KEY, "A", "POST", path, body, to="B"), "wrong_peer"),
            (sign(KEY, "A", "POST", path, body), "wrong_peer"),       # for no machine
            ({"X-Berth-Peer": "A"}, "unsigned")):
        code, doc, _ = http(c.port, "POST", path, raw=body, headers=headers)
        assert code == 401 and doc["reason"] == reason and doc["src"] == "berth", doc
    good = sign(KEY, "A", "POST", path, body, to="C")
    assert http(c.port, "POST", path, raw=body, headers=good)[0] == 200
    code, doc, _ = http(c.port, "POST", path, raw=body, headers=good)     # the same call again
    assert code == 401 and doc["reason"] == "replayed", doc
    code, doc, _ = http(c.port, "GET", "/berth/v1/peer/engines",
                        headers=sign("w" * 32, "A", "GET", "/berth/v1/peer/engines"))
    assert code == 401, doc

    # Stop C: A answers a clear 503 for C's models within the peer timeout (1 s), and keeps
    # serving its own.
    c.stop()
    t0 = time.monotonic()
    code, doc, _ = chat(a.port, "c-only")
    took = time.monotonic() - t0
    assert code == 503 and doc["src"] == "peer" and doc["reason"] == "peer_down", doc
    assert doc["error"]["code"] == 503 and "C" in doc["error"]["message"]
    assert took < ceiling(1.0), took
    t0 = time.monotonic()
    code, doc, _ = chat(a.port, "c-only")          # C is now skipped without a try
    assert code == 503 and time.monotonic() - t0 < ceiling(1.0)
    code, doc, h = chat(a.port, "a-model")
    assert code == 200 and h["X-Berth-Machine"] == "A"
    # The shared model now goes to B, which holds it parked: B wakes it and answers.
    code, doc, h = chat(a.port, "shared")
    assert code == 200 and h["X-Berth-Machine"] == "B", doc
    wait_for(lambda: a.models()["_machines"][2]["up"] is False, 5, "A lists C as down")
