"""berthd loads prometheus_client at the first scrape of ``/metrics``, not at its start (issue 38:
the suite starts berthd hundreds of times, and most are never scraped), and the front's own
modules (``berth run``'s proxy) not at all: berthd reads only the listener's limits. Nor does it
load xmlrpc.client for the supervisord host's plugin until a call to supervisord."""

from __future__ import annotations

from tests.berthd import api, wait_for


def _imported(log: str) -> set[str]:
    """The modules ``-X importtime`` (``$PYTHONPROFILEIMPORTTIME``) listed in berthd's log."""
    return {line.rpartition("|")[2].strip() for line in log.splitlines()
            if line.startswith("import time:")}


def test_prometheus_loads_at_the_first_scrape(berthd):
    d = berthd(start=False)
    d.env["PYTHONPROFILEIMPORTTIME"] = "1"
    d.start()
    found = _imported(d.log.read_text())
    assert "berth.daemon.api" in found                  # the reading is not vacuous
    early = sorted(m for m in found if m.startswith(("prometheus_client", "berth.front.front",
                                                     "berth.daemon.api_metrics", "xmlrpc")))
    assert not early, early
    code, out = api(d.sock, "GET", "/metrics")
    assert code == 200 and "berth_card_total_bytes" in out["raw"], out
    wait_for(lambda: "prometheus_client" in _imported(d.log.read_text()),
             what="berthd's log to list prometheus_client after the scrape")


def test_the_one_call_commands_import_no_aiohttp(berthd):
    """``berth status``, ``hold``, ``release-hold`` and ``size LEASE`` make one call to berthd
    each: with the standard library's client (:mod:`berth.client_sync`), not aiohttp, whose
    import was most of their start-up CPU (issue 38)."""
    import os
    import subprocess

    from tests.berthd import BERTH
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "A", "owner_pid": os.getpid(),
                                            "shares": [{"card": None, "size": "2GiB"}]})
    assert code == 201, r
    env = {**d.env, "PYTHONPROFILEIMPORTTIME": "1"}
    for argv, said in ((["status"], "gpu0"), (["hold", "A"], "hold A"),
                       (["release-hold", "A"], "release-hold A"), (["size", "A"], "A")):
        p = subprocess.run([BERTH, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and said in p.stdout, (argv, p.stdout, p.stderr[-2000:])
        found = _imported(p.stderr)
        assert "berth.cli" in found                     # the reading is not vacuous
        assert not {m for m in found if m.split(".")[0] in ("aiohttp", "asyncio")}, argv
        if argv[0] == "status":     # it reads berth.toml, not the decision model's dataclasses
            assert "berth.config.models" in found and "berth.decide.model" not in found, found
