"""Engine and tool faults (issue 18 "run and engine faults"), beside tests/making_room/test_fallbacks.py
(park never freed, checkpoint tool hanging, wake never answering): the checkpoint tool failing,
a lend acknowledged and never freed, the engine crashing while parked and while restoring. Each ends in the seed's fallback (rule 4:
a failed park falls back to a drain; an engine that dies ends its lease once the driver shows
its memory free), is counted, and leaves no request hanging."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

import tests.making_room.test_fallbacks as fallbacks
from tests.helpers import wait_for
from tests.making_room.conftest import live  # noqa: F401  (the fixture)
from tests.making_room.world import CHECKPOINT, chat, gone, served

CARD = [("gpu0", "8GiB")]
PARK = ["--size", "4GiB", "--park", "checkpoint", "--checkpoint-path", CHECKPOINT]


def test_a_failing_checkpoint_tool_falls_back_to_drain(live):  # noqa: F811
    lv = live(CARD, release_grace="10s", ram_budget="16GiB")
    h = lv.run("H", PARK, ["--weights", "3GiB"], env={"BERTH_SIM_CHECKPOINT_UNSUPPORTED": "1"})
    hl = lv.wait_serving("H")
    served(h.front)
    t0 = time.monotonic()
    lv.run("W", ["--size", "4GiB"], ["--weights", "3GiB"])
    fb = fallbacks._fell_back_to_drain(lv, h, hl, "W", within_s=30, since=t0)
    assert "park failed" in fb["text"], fb


def _crash(pid: int) -> None:
    psutil.Process(pid).kill()


@pytest.mark.long
def test_an_engine_crashing_while_parked_ends_its_lease(live):  # noqa: F811
    lv = live(CARD, ram_budget="16GiB")
    h = lv.run("H", PARK, ["--weights", "3GiB"])
    hl = lv.wait_serving("H")
    served(h.front)
    assert lv.operator("park", "H")[0] == 200
    wait_for(lambda: lv.states("H") == {"gpu0": "parked"}, 30, "H parked")
    _crash(hl["pid"])
    wait_for(lambda: h.exited() is not None, 30, "the run to see its engine gone")
    wait_for(lambda: lv.lease("H") is None, 30, "H's lease to end")
    t0 = time.monotonic()
    assert lv.card_use("gpu0") == {} and lv.oom_events() == 0
    # A new engine gets the whole card: nothing of H is left half asleep.
    lv.run("W", ["--size", "7GiB"], ["--weights", "6GiB"])
    lv.wait_serving("W", 60)
    assert time.monotonic() - t0 < 60


def test_an_engine_crashing_while_restoring_answers_its_held_request(live):  # noqa: F811
    lv = live(CARD, ram_budget="16GiB")
    h = lv.run("H", PARK, ["--weights", "3GiB"], env={"BERTH_SIM_CHECKPOINT_BPS": "1e9"})
    hl = lv.wait_serving("H")
    served(h.front)
    assert lv.operator("park", "H")[0] == 200
    wait_for(lambda: lv.states("H") == {"gpu0": "parked"}, 60, "H parked")
    answer: list = []
    held = threading.Thread(target=lambda: answer.append(chat(h.front, timeout_s=90)),
                            daemon=True)
    t0 = time.monotonic()
    held.start()                                    # wakes H: a 3 GiB restore at 1 GB/s
    wait_for(lambda: lv.states("H") == {"gpu0": "resuming"}, 30, "H resuming")
    _crash(hl["pid"])
    held.join(60)
    assert not held.is_alive(), "the held request hangs"
    status, body = answer[0]
    assert status in (502, 503) and body.get("src") == "berth", (status, body)
    assert time.monotonic() - t0 < 60
    wait_for(lambda: lv.lease("H") is None, 30, "H's lease to end")
    assert gone(hl["pid"]) and lv.card_use("gpu0") == {} and lv.oom_events() == 0


def test_a_lend_acknowledged_but_never_freed_falls_back_to_drain(live):  # noqa: F811
    """H answers its lend with 200 and frees nothing (``--lend-noop``): the driver never shows
    the 8 GiB gone, so after the release grace H is drained (rule 4), B gets the card, and a
    request to B is served."""
    lv = live([("gpu0", "24GiB")], release_grace="2s")
    h = lv.run("H", ["--size", "20GiB", "--lend", "--lend-max", "8GiB", "--park", "hook",
                     "--adapter", "protocol"],
               ["--weights", "11GiB", "--kv-pool", "8.75GiB", "--protocol", "--lend",
                "--lend-noop"])
    hl = lv.wait_serving("H")
    served(h.front)
    t0 = time.monotonic()
    b = lv.run("B", ["--size", "8GiB"], ["--weights", "7GiB"])
    wait_for(lambda: gone(hl["pid"]), 30, "H's run to stop its engine (the run stays)")
    assert time.monotonic() - t0 < 30
    assert gone(hl["pid"]), "H's engine still runs"
    lv.wait_serving("B", 60)
    fb = lv.entry("H", "fallback")
    assert "lend not confirmed by the driver within release_grace (2s)" in fb["text"], fb
    assert fb["seq"] < lv.entry("B", "grant")["seq"]
    c = lv.counters()
    assert c["lends"] == 1 and c["fallbacks_to_drain"] == 1 and c["drains"] == 1, c
    status, body = chat(b.front, timeout_s=60)
    assert status == 200, body
    assert lv.oom_events() == 0
