"""``berth wake`` on a drained run (issue 35): the run asks for its card again now.

One simulated 24 GiB card (1 GiB reserve); B (12 GiB) serves behind a plain ``berth run``, then
W (20 GiB) asks and B is drained: its run keeps its front and waits, with no lease. W's run then
ends, so the card is free. Before, ``berth wake B`` answered 409 ("B is drained ... no operator
action applies; its next request (a write) starts it again"), exit 1, and the only way to warm
B was to send it a write. Now ``berth wake B`` makes B's run ask for its card again, as a write
would, and B's engine starts once granted (through the queue, like any lease): it serves
through its front before any request was sent. The other operator actions (park, drain, hold,
release-hold) still say that B is drained.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request

from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc
from tests.helpers import free_port, stop_all, wait_for
from tests.run.world import chat


def _drained(d: Berthd, engine: str) -> dict | None:
    return next((r for r in d.status()["drained"] if r["engine"] == engine), None)


def _berth(d: Berthd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, *args], env=d.env, capture_output=True, text=True, timeout=60)


def _reads(port: int) -> bool:
    """Whether the front forwards a read (``GET /v1/models``): only once its engine serves (a
    read wakes nothing, and a sleeping front answers it 503)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _b_drained(tmp_path):
    """berthd on one 24 GiB card; B (12 GiB) served, was drained for W (20 GiB), and W's run
    has ended: the card is free and B's run waits behind its front. Yields ``(d, pb, b)``."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    pb = free_port()
    procs = [berth_run(d, "B", "--front", f"127.0.0.1:{pb}", "--size", "12GiB",
                       weights="11GiB"), d.proc]
    try:
        wait_for(lambda: d.state_of("B") == "active", 60, "B granted")
        assert chat(pb, "B").finish_reason is not None
        w = berth_run(d, "W", "--front", f"127.0.0.1:{free_port()}", "--size", "20GiB",
                      weights="19GiB")
        procs.append(w)
        wait_for(lambda: d.state_of("W") == "active", 60, "W granted")
        wait_for(lambda: _drained(d, "B"), 30, "B listed as drained")
        assert stop_proc(w) == 0                   # W's run ends: its card is free
        wait_for(lambda: d.lease_of("W") is None, 30, "W's lease released")
        assert d.lease_of("B") is None and procs[0].poll() is None
        assert not _reads(pb)                      # asleep: its engine is stopped
        yield d, pb, procs[0]
    finally:
        stop_all(procs, tmp_path)


def test_berth_wake_starts_a_drained_run_again_before_any_request(tmp_path):
    with _b_drained(tmp_path) as (d, pb, b):
        t0 = time.monotonic()
        r = _berth(d, "wake", "B")
        assert r.returncode == 0, r.stderr
        assert "wake B (drained)" in r.stdout and "asks for its card again" in r.stdout, r.stdout
        wait_for(lambda: (d.lease_of("B") or {}).get("ready"), 60, "B's engine started again")
        assert d.state_of("B") == "active"
        wait_for(lambda: _reads(pb), 30, "B's front forwarding")
        served_s = time.monotonic() - t0
        assert served_s < 20, f"{served_s:.1f} s from berth wake to B serving"
        print(f"berth wake -> B serving: {served_s:.2f} s")
        wait_for(lambda: _drained(d, "B") is None, 30, "B no longer drained")
        answer = chat(pb, "B")
        assert answer.finish_reason is not None and answer.text, answer
        assert b.poll() is None and d.sim_oom() == 0


def test_other_operator_actions_on_a_drained_run_say_it_is_drained(tmp_path):
    with _b_drained(tmp_path) as (d, pb, b):
        for op in ("park", "drain", "hold", "release-hold"):
            r = _berth(d, op, "B")
            assert r.returncode == 1, (op, r.stdout, r.stderr)
            assert "B is drained" in r.stderr and f"127.0.0.1:{pb}" in r.stderr, r.stderr
            assert "berth wake B" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert d.lease_of("B") is None and _drained(d, "B") is not None
        assert b.poll() is None
