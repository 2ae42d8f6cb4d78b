"""A wake lives no longer than the prompts that asked for it (issue 37 "A wake for a prompt
that is gone"). Seen with the real ComfyUI 0.3.64: a prompt queued while an LLM held the card,
then deleted from the queue, interrupted or left by its client, kept its wake queued (still
there 5 s later), and the LLM was checkpointed to wake ComfyUI for nobody. The stand-in answers
``POST /queue {"delete": [...]}`` and ``POST /interrupt`` as ComfyUI 0.3.64's server.py does."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from tests.berthd import berth_run, wait_for
from tests.helpers import ceiling

from .conftest import http, prompt
from .test_requests_for_room import FLUX, _busy_llm_beside_comfyui


def _parked_comfyui_beside_a_busy_llm(world):
    """ComfyUI parked, a busy LLM inside its minimum turn, and the rest of the card held by
    an engine nothing displaces: a wake of ComfyUI waits for the LLM."""
    d, c, chat = _busy_llm_beside_comfyui(world, wait_limit="30s")
    assert d.call("POST", "/v1/operator/park", {"target": "comfyui"})[0] == 200
    wait_for(lambda: d.state_of("comfyui") == "parked" and c.berth()["gate"]["state"] == "asleep",
             20, "ComfyUI parked")
    left = d.status()["cards"][0]["available_bytes"]
    code, r = d.call("POST", "/v1/leases", {"engine": "filler", "priority": 9,
                                            "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": left}]})
    assert code == 201, r
    wait_for(lambda: d.state_of("filler") == "active", 10, "the filler granted")
    d.filler = r["id"]
    return d, c, chat


def _wake_queued(d) -> bool:
    return [w["kind"] for w in d.status()["waiting"]] == ["resume"]


def _gone_within(d, limit_s: float) -> float:
    """Seconds until berthd's queue is empty (bounded by a generous ceiling), asserted under
    ``limit_s``."""
    t0 = time.monotonic()
    wait_for(lambda: d.status()["waiting"] == [], 10, "the wake withdrawn")
    took = time.monotonic() - t0
    # limit_s scaled by the machine's slowness (issue 38: 1.04 s against 1 s on a loaded one)
    assert took < ceiling(limit_s), f"the wake was withdrawn after {took:.2f}s"
    return took


def _nothing_parked_for_nobody(world, d, c, chat) -> None:
    """The chat ends and the LLM goes idle; a later admission pass would park it for a wake
    left queued. It stays active, and no checkpoint starts."""
    assert any(e["kind"] == "wake.off" for e in d.timeline()), d.timeline()
    assert c.berth()["gate"]["state"] == "asleep"
    chat.join(30)
    wait_for(lambda: d.lease_of("llm")["in_flight"] == 0, 10, "the LLM idle")
    assert d.call("POST", f"/v1/leases/{d.filler}/release", {"reason": "done"})[0] == 200
    wait_for(lambda: d.lease_of("filler") is None, 10, "the filler gone")
    world.procs.append(berth_run(d, "probe", "--size", "1GiB", weights="512MiB"))
    wait_for(lambda: d.state_of("probe") == "active", 20, "a later lease granted")
    assert d.state_of("llm") == "active", d.timeline()
    assert not [e for e in d.timeline() if e["kind"] in ("park", "plan", "checkpoint")
                and e.get("engine") == "llm"], d.timeline()
    assert d.sim_oom() == 0


@pytest.mark.parametrize("take_back", [
    ("/queue", {"delete": ["held-1"]}, "deleted"),
    ("/api/interrupt", {"prompt_id": "held-1"}, "interrupted"),
    ("/interrupt", {}, "interrupted"),
], ids=["deleted", "interrupted-by-id", "interrupted"])
def test_a_held_prompt_taken_back_withdraws_its_wake(world, take_back):
    path, body, reason = take_back
    d, c, chat = _parked_comfyui_beside_a_busy_llm(world)
    held = c.post_in_thread("/prompt", {**prompt(FLUX), "prompt_id": "held-1"})
    wait_for(lambda: _wake_queued(d), 10, "ComfyUI's wake queued behind the busy LLM")
    code, _ = c.post(path, body)
    assert code == 200
    _gone_within(d, 1.0)
    held["thread"].join(10)
    assert held["status"] == 503 and held["body"]["error"]["details"] == reason, held
    _nothing_parked_for_nobody(world, d, c, chat)


def test_a_held_prompt_whose_client_left_withdraws_its_wake(world):
    d, c, chat = _parked_comfyui_beside_a_busy_llm(world)
    raw = json.dumps(prompt(FLUX)).encode()
    port = int(c.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        wait_for(lambda: _wake_queued(d), 10, "ComfyUI's wake queued behind the busy LLM")
    _gone_within(d, 1.0)          # the gate looks at its client every 0.5 s
    assert c.berth()["gate"]["client_gone"] == 1
    _nothing_parked_for_nobody(world, d, c, chat)


def test_the_stand_in_deletes_and_interrupts_as_comfyui_does(world):
    """Without Berth in the way (berthd absent: the gate is off), ``/queue`` deletes a pending
    prompt by its id and ``/interrupt`` with the id of a prompt that is not running does
    nothing, as server.py 0.3.64."""
    world.no_berthd()
    c = world.comfyui("--disable-dynamic-vram", step_s=0.5)
    first = c.post("/prompt", {**prompt(steps=20), "prompt_id": "runs"})
    assert first[0] == 200, first
    assert c.post("/prompt", {**prompt(), "prompt_id": "waits"})[0] == 200
    wait_for(lambda: [x[1] for x in c.get("/queue")[1]["queue_running"]] == ["runs"], 10,
             "the first prompt running")
    assert c.get("/queue")[1]["queue_pending"][0][1] == "waits"
    assert c.post("/interrupt", {"prompt_id": "waits"})[0] == 200      # not running: ignored
    assert c.post("/queue", {"delete": ["waits"]})[0] == 200
    assert c.get("/queue")[1]["queue_pending"] == []
    assert http("POST", c.url + "/api/interrupt", {"prompt_id": "runs"})[0] == 200
    wait_for(lambda: c.done("runs"), 20, "the running prompt interrupted")
    assert c.done("runs")["status_str"] == "error", c.done("runs")

