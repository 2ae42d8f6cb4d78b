"""Sizes and states agree (issue 37 "Figures that mislead"): a 3 GiB lease shows 3 GiB on the
web board, in ``berth status`` and in the metrics (the board's lease table showed the driver's
read of its use, "0 B" while the engine held nothing); a lease whose bound is not declared has
its size said as a ceiling; a health read of a drained engine keeps llama-swap's 200 and gives
a monitor the true state (a field, a header, a metric)."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.berthd import BERTH, Berthd, GiB, berth_run, sim_config, wait_for
from tests.board.test_board import ARGS, CHROMIUM
from tests.helpers import free_port, playwright, stop_all


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world(tmp_path):
    port = _port()
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")],
                                    extra=f'[board]\nlisten = "127.0.0.1:{port}"\n'))
    d.url = f"http://127.0.0.1:{port}/"
    d.runs = []
    d.start()
    yield d
    stop_all([*d.runs, d.proc], tmp_path)


def _metrics(d) -> str:
    with urllib.request.urlopen(d.url + "metrics", timeout=10) as r:
        return r.read().decode()


def _sample(d, name: str, **labels) -> float | None:
    """The value of the metric ``name`` whose labels include ``labels``, or ``None``."""
    from prometheus_client.parser import text_string_to_metric_families
    for fam in text_string_to_metric_families(_metrics(d)):
        for smp in fam.samples:
            if smp.name == name and labels.items() <= smp.labels.items():
                return smp.value
    return None


def _board_row(d, engine: str) -> dict:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = b.new_page()
            page.goto(d.url)
            page.wait_for_selector(f"#leases tbody tr[data-engine='{engine}'] td.size")
            return page.evaluate("""e => { const r = document.querySelector(
                `#leases tbody tr[data-engine='${e}']`);
                return {size: r.querySelector('td.size').textContent,
                        used: r.querySelector('td.used').textContent}; }""", engine)
        finally:
            b.close()


def test_a_3gib_lease_shows_3gib_on_the_board_in_status_and_in_the_metrics(world):
    d = world
    # An engine that holds nothing on the card: the driver reads 0 B for it.
    d.runs.append(subprocess.Popen([BERTH, "run", "--engine", "idle", "--size", "3GiB",
                                    "--health", "none", "--", "sleep", "600"], env=d.env,
                                   start_new_session=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.STDOUT))
    wait_for(lambda: (d.lease_of("idle") or {}).get("shares", [{}])[0].get("used_bytes") == 0,
             60, "idle active with 0 B read")
    row = _board_row(d, "idle")
    assert row["size"] == "3.0 GiB", row
    status = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                            timeout=60).stdout
    line = next(x for x in status.splitlines() if x.strip().startswith("idle"))
    assert "3.0GiB counted, size 3.0GiB" in line, status
    assert _sample(d, "berth_share_size_bytes", engine="idle", bound="declared") == 3 * GiB
    assert _sample(d, "berth_share_counted_bytes", engine="idle") == 3 * GiB
    assert _sample(d, "berth_share_used_bytes", engine="idle") == 0


def test_a_growth_bound_says_its_size_is_a_ceiling(world):
    d = world
    code, r = d.call("POST", "/v1/leases", {"engine": "comfyui", "bound": "growth",
                                            "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "6GiB",
                                                        "need": "1GiB"}]})
    assert code == 201, r
    wait_for(lambda: d.state_of("comfyui") == "active", 30, "comfyui granted")
    row = _board_row(d, "comfyui")
    assert row["size"] == "1.0 GiB of a 6.0 GiB ceiling", row
    status = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                            timeout=60).stdout
    assert "1.0GiB counted, growth bound, ceiling 6.0GiB" in status, status
    assert _sample(d, "berth_share_size_bytes", engine="comfyui", bound="growth") == 6 * GiB
    assert _sample(d, "berth_share_counted_bytes", engine="comfyui") == 1 * GiB


def test_a_drained_engine_reads_200_for_llama_swap_and_drained_for_a_monitor(world):
    d = world
    front = free_port()
    d.runs.append(berth_run(d, "llm", "--front", f"127.0.0.1:{front}", "--front-health",
                            "--keep-front", "--size", "2GiB", weights="1GiB"))
    wait_for(lambda: (d.lease_of("llm") or {}).get("ready"), 60, "llm serving")
    assert d.call("POST", "/v1/operator/drain", {"target": "llm"})[0] == 200
    wait_for(lambda: "drained; its front stays" in (d.tmp / "run-llm.log").read_text(), 60,
             "the run keeping its front after the drain")
    with urllib.request.urlopen(f"http://127.0.0.1:{front}/health", timeout=10) as r:
        assert r.status == 200                      # llama-swap's readiness is kept
        body = r.read().decode()
        assert r.headers["X-Berth-Engine"] == "drained", dict(r.headers)
    assert '"engine": "drained"' in body, body
    assert _sample(d, "berth_engine_up", engine="llm", state="stopped") == 0
