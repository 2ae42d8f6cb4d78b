"""An engine that does not answer its health check yet is said in the run's log, with the URL,
how long and the last answer, rather than silence until a held request's wait limit (review
finding: an engine that never listened left `berth run` silent for 120 s)."""

from __future__ import annotations

from tests.berthd import berth_run
from tests.helpers import free_port, wait_for


def test_an_engine_still_loading_is_said_with_its_health_url_and_last_answer(berthd, runs):
    d = berthd()
    runs.append(berth_run(d, "L", "--front", f"127.0.0.1:{free_port()}", "--size", "2GiB",
                          weights="1GiB", load_s=120))
    log = d.tmp / "run-L.log"
    wait_for(lambda: "has not answered" in log.read_text(), timeout_s=60,
             what="the run's note on the engine it waits for")
    line = next(x for x in log.read_text().splitlines() if "has not answered" in x)
    assert "/health with 200 for" in line and "(last: HTTP 503)" in line, line
