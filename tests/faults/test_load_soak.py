"""Load and soak (issue 18): ``bench/soak.py`` end to end. The default run holds the short
form (18 s of 64 clients on three engines sharing one card, a forced switch every 3 s, a
berthd SIGKILL and restart and an engine SIGKILL inside it); ``BERTH_RELIABILITY=long`` adds the load test proper
(at least 2,000 requests, no faults but the forced switches) and a 3-minute soak.

Every request must end 200 and complete, or 503 with a reason, before its deadline: no hang,
no other answer; the card records no OOM; berthd's RSS grows by at most 10 MiB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def _soak(*args: str, timeout: float) -> dict:
    p = subprocess.Popen([sys.executable, str(SOAK), "--json", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()                   # the soak ends its berthd and runs on SIGTERM
        stdout, stderr = p.communicate(timeout=60)
    assert stdout.strip(), stderr[-12000:]     # a failed start: every engine's state and log
    res = json.loads(stdout.strip().splitlines()[-1])
    print("soak:", json.dumps(res))
    return res


def _holds(res: dict, *, engine_faults: bool) -> None:
    assert res["hangs"] == 0 and res["still_running"] == 0, res
    assert res["oom_events"] == 0, res
    other = dict(res["other"])
    if engine_faults:          # the front of a killed engine is down until its run restarts,
        other.pop("connect", None)     # and the requests it had in flight end with a 502
        other.pop("engine_killed", None)
    assert other == {}, res
    assert res["answered"] > 0 and res["berthd_rss_growth_mib"] <= 10, res


@pytest.mark.early(25)
@pytest.mark.timeout(300)
def test_soak_short_form():
    res = _soak("--minutes", "0.3", "--fault-every", "5", "--faults-at-least", "2",
                timeout=200)
    assert res["faults"].get("berthd_sigkill", 0) >= 1 and res["faults"].get("engine_sigkill", 0) >= 1, res
    _holds(res, engine_faults=True)


@pytest.mark.long
@pytest.mark.timeout(720)
def test_load_2000_requests_64_clients_forced_switches():
    res = _soak("--minutes", "4", "--no-faults", "--switch-every", "3", timeout=600)
    assert res["requests_sent"] >= 2000, res
    assert res["switches"] >= 10, res
    _holds(res, engine_faults=False)


@pytest.mark.long
@pytest.mark.timeout(720)
def test_soak_three_minutes_with_every_fault():
    res = _soak("--minutes", "3", timeout=600)
    assert set(res["faults"]) == {"berthd_sigkill", "engine_sigkill", "drain"}, res
    _holds(res, engine_faults=True)
