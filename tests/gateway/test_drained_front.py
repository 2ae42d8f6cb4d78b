"""The gateway sends a drained engine's requests to the front its run keeps (issue 35).

A drained run holds no lease but keeps its front, which holds a write and starts the engine
again. The gateway built its routes from leases only, so it answered such a model 503
``no_front`` (an engine entry with no front of its own) or ``engine_stopped`` (no entry), and
the run waited for a request that never came. Now berthd lists a drained run's front, checked
by the same rules as a lease's (issue 26: names are owned, fronts are on this machine), and the
gateway routes to it as it does to a parked engine's: the request is held there and answered
once the engine serves again. A real berthd, real runs, a real gateway.
"""

from __future__ import annotations

from tests.berthd import wait_for
from tests.gateway.world import chat


def _drained(m, engine: str) -> dict | None:
    return next((e for e in m.d.status()["drained"] if e["engine"] == engine), None)


def test_a_drained_engine_is_routed_to_the_front_its_run_keeps(machine):
    # alpha has an entry of its own with no front (size only); beta has none; beta's alias
    # routes too.
    m = machine("solo", extra='[engines.alpha]\nsize = "4GiB"\n')
    m.run("alpha")
    m.run("beta", aliases=("org/beta-7b",))
    m.serving("alpha")
    m.serving("beta")
    m.gateway()
    for model in ("alpha", "org/beta-7b"):
        code, doc, _ = chat(m.port, model)
        assert code == 200, doc

    for engine in ("alpha", "beta"):
        code, out = m.d.call("POST", "/v1/operator/drain", {"target": engine})
        assert code == 200, out
        entry = wait_for(lambda e=engine: _drained(m, e), 30, f"{engine} listed as drained")
        assert entry["owner_checked"] and entry["front_checked"], entry
        assert m.d.lease_of(engine) is None

    def states() -> dict:
        return {k: v["berth"]["state"] for k, v in m.models().items() if k != "_machines"}
    wait_for(lambda: states() == {"alpha": "drained", "beta": "drained"}, 10,
             "the gateway lists both as drained")

    for model, engine in (("alpha", "alpha"), ("org/beta-7b", "beta")):
        code, doc, h = chat(m.port, model)
        assert code == 200, (model, doc)
        assert doc["model"] == engine and h["X-Berth-Machine"] == "solo", doc
        assert m.d.state_of(engine) == "active"
        wait_for(lambda e=engine: _drained(m, e) is None, 30, f"{engine} no longer drained")
