"""Rule 4 live (seed 002 "Every sleep has a way back and a fallback"): "A park or lend that does
not free the memory within the release grace falls back to a drain. A wake that does not answer
stops the engine. Nothing stays half asleep."

Each case runs a real berthd, ``berth run`` with a front, and a stub engine or the stand-in
cuda-checkpoint that misbehaves on purpose. The run's own action timeouts are left at their
defaults (20 s for a park, 60 s for a wake) unless a case says otherwise: berthd's
``release_grace`` and ``wake_limit`` decide, and the run must follow them.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.helpers import wait_for
from tests.making_room.world import CHECKPOINT, GiB, MiB, chat, gone, served

# One 8 GiB card, 1 GiB reserve: the holder's 4 GiB and the waiter's 4 GiB do not fit together.
CARD = [("gpu0", "8GiB")]


def _fell_back_to_drain(lv, h, hl, waiter: str, *, within_s: float, since: float) -> dict:
    """The holder's run stopped its engine, the waiter was granted once the driver confirmed the
    memory free, and exactly one fallback was counted. Returns the fallback entry."""
    wait_for(lambda: gone(hl["pid"]), within_s, "the holder's run to stop its engine (the run stays)")
    assert time.monotonic() - since < within_s
    assert gone(hl["pid"]), "the holder's engine still runs"
    w = lv.wait_serving(waiter, 60)
    c = lv.counters()
    assert c["fallbacks_to_drain"] == 1 and c["drains"] == 1, c
    fb = lv.entry("H", "fallback")
    drain, freed, grant = lv.entry("H", "drain"), lv.entry("H", "freed"), lv.entry(waiter, "grant")
    assert fb["seq"] < drain["seq"] < freed["seq"] < grant["seq"]
    assert lv.card_use("gpu0") == {w["pid"]: 256 * MiB + 3 * GiB}
    assert lv.oom_events() == 0
    return fb


def test_a_park_acknowledged_but_never_freed_falls_back_to_drain(live):
    lv = live(CARD, release_grace="2s")
    h = lv.run("H", ["--size", "4GiB", "--park", "hook", "--adapter", "protocol"],
               ["--weights", "3GiB", "--protocol", "--park-noop"])
    hl = lv.wait_serving("H")
    served(h.front)
    t0 = time.monotonic()
    lv.run("W", ["--size", "4GiB"], ["--weights", "3GiB"])
    wait_for(lambda: lv.states("H") == {"gpu0": "parking"} or gone(hl["pid"]), 30,
             "H to park")
    fb = _fell_back_to_drain(lv, h, hl, "W", within_s=30, since=t0)
    assert "park not confirmed by the driver within release_grace (2s)" in fb["text"], fb
    assert lv.counters()["parks"] == 1
    # The engine said it parked (200); only the driver read was believed.
    assert "instruction park" in h.text() and "park failed" not in h.text()


@pytest.mark.parametrize("who", ["berthd", "tool"])
def test_a_checkpoint_tool_that_hangs_falls_back_to_drain(live, who):
    """``berthd``: berthd's release_grace (2 s) passes while the tool hangs, far inside the run's
    own 60 s; the run calls the park off, kills the tool and stops the engine. ``tool``: the run's
    own timeout (2 s) kills the tool first, the park is reported failed and berthd falls back at
    once, long before its release_grace (60 s). Either within 30 s of the waiter's start."""
    grace, run_grace = ("2s", "60s") if who == "berthd" else ("60s", "2s")
    lv = live(CARD, release_grace=grace, ram_budget="16GiB")
    h = lv.run("H", ["--size", "4GiB", "--park", "checkpoint", "--checkpoint-path", CHECKPOINT,
                     "--release-grace", run_grace],
               ["--weights", "3GiB"], env={"BERTH_SIM_CHECKPOINT_HANG_S": "60"})
    hl = lv.wait_serving("H")
    served(h.front)
    t0 = time.monotonic()
    lv.run("W", ["--size", "4GiB"], ["--weights", "3GiB"])
    wait_for(lambda: _tools(hl["pid"]) or gone(hl["pid"]), 30, "the checkpoint tool to run")
    fb = _fell_back_to_drain(lv, h, hl, "W", within_s=30, since=t0)
    if who == "berthd":
        assert "park not confirmed by the driver within release_grace (2s)" in fb["text"], fb
    else:
        assert "park failed" in fb["text"] and "did not finish within" in fb["text"], fb
    assert lv.counters()["checkpoints"] == 1
    assert not _tools(hl["pid"]), "a hung cuda-checkpoint outlived the park"


def test_a_wake_that_never_answers_stops_the_engine_and_its_held_request_gets_a_503(live):
    lv = live(CARD, wake_limit="3s")
    h = lv.run("H", ["--size", "4GiB", "--park", "hook", "--adapter", "protocol"],
               ["--weights", "3GiB", "--protocol", "--wake-hang"])
    hl = lv.wait_serving("H")
    served(h.front)
    code, r = lv.operator("park", "H")
    assert code == 200, r
    wait_for(lambda: lv.states("H") == {"gpu0": "parked"}, 30, "H parked")

    t0 = time.monotonic()
    status, body = chat(h.front, timeout_s=90)       # held while the wake hangs
    waited = time.monotonic() - t0
    assert status == 503 and body["src"] == "berth", body
    # The run now takes berthd's wake_limit (3 s) for its own wake too, so either side may
    # give up first; both name the wake and the limit.
    assert "wake" in body["reason"] and "did not answer within" in body["reason"], body
    assert "did not answer" in body["error"]["message"], body
    assert 2 <= waited < 40, waited                  # the 3 s wake_limit, not a 60 s default
    wait_for(lambda: gone(hl["pid"]), 30, "the run to stop its engine")
    assert gone(hl["pid"])
    drain = lv.entry("H", "drain")
    assert "wake" in drain["text"] and "did not answer" in drain["text"], drain
    wait_for(lambda: lv.lease("H") is None, 30, "H's memory confirmed free")
    c = lv.counters()
    # A wake that does not answer falls back to a drain (rule 4), and is counted as one.
    assert c["drains"] == 1 and c["wakes"] == 0 and c["fallbacks_to_drain"] == 1, c
    assert lv.entry("H", "resume")["seq"] < drain["seq"] < lv.entry("H", "freed")["seq"]
    assert lv.card_use("gpu0") == {} and lv.oom_events() == 0


def _tools(pid: int) -> list[psutil.Process]:
    """Stand-in cuda-checkpoint processes acting on ``pid``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any("cuda-checkpoint" in a for a in cmd) and str(pid) in cmd:
            found.append(p)
    return found
