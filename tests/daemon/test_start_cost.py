"""berthd loads prometheus_client at the first scrape of ``/metrics``, not at its start (issue 38:
the suite starts berthd hundreds of times, and most are never scraped), and the front's own
modules (``berth run``'s proxy) not at all: berthd reads only the listener's limits."""

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
                                                     "berth.daemon.api_metrics")))
    assert not early, early
    code, out = api(d.sock, "GET", "/metrics")
    assert code == 200 and "berth_card_total_bytes" in out["raw"], out
    wait_for(lambda: "prometheus_client" in _imported(d.log.read_text()),
             what="berthd's log to list prometheus_client after the scrape")
