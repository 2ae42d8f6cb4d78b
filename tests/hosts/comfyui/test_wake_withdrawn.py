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
from berth.sim.cards import SimCards

from tests.berthd import BERTH, berth_run, wait_for
from tests.helpers import ceiling

from .conftest import http, prompt
from .test_requests_for_room import FLUX, _busy_llm_beside_comfyui


def _parked_comfyui_beside_a_busy_llm(world):
    """ComfyUI parked, a busy LLM inside its minimum turn, and the rest of the card held by
    an engine nothing displaces: a wake of ComfyUI waits for the LLM. The LLM's chat is held
    (``--token-hold``) until :func:`_nothing_parked_for_nobody` lets it end."""
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
    assert chat.is_alive() and d.lease_of("llm")["in_flight"] >= 1   # still busy all along
    (d.tmp / "token-hold").unlink()
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
    ("/interrupt", None, "interrupted"),
], ids=["deleted", "interrupted-by-id", "interrupted", "interrupted-no-body"])
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


def _raw(url: str, body: bytes | None) -> int:
    """POST ``body`` as it is (``None``: no body at all); the answer's status."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_stand_in_reads_bodies_as_comfyui_does(world):
    """server.py 0.3.64's handlers, body by body: ``/interrupt`` with no body or one that is not
    JSON interrupts what runs; a JSON body that is not an object raises (500) and interrupts
    nothing; ``/queue``'s ``delete`` compares prompt ids as given (``5`` is not ``"5"``), and a
    ``delete`` of null raises (500)."""
    world.no_berthd()
    c = world.comfyui("--disable-dynamic-vram", step_s=0.5)
    assert c.post("/prompt", {**prompt(steps=40), "prompt_id": "runs"})[0] == 200
    assert c.post("/prompt", {**prompt(), "prompt_id": "5"})[0] == 200
    wait_for(lambda: [x[1] for x in c.get("/queue")[1]["queue_running"]] == ["runs"], 10,
             "the first prompt running")
    assert _raw(c.url + "/interrupt", b"null") == 500
    assert _raw(c.url + "/interrupt", b"[]") == 500
    assert _raw(c.url + "/queue", b'{"delete": null}') == 500
    assert c.post("/queue", {"delete": [5]})[0] == 200
    assert [x[1] for x in c.get("/queue")[1]["queue_pending"]] == ["5"]
    assert c.get("/queue")[1]["queue_running"] and c.done("runs") is None    # still running
    assert _raw(c.url + "/interrupt", b"not json") == 200
    wait_for(lambda: c.done("runs"), 20, "the running prompt interrupted")
    assert c.done("runs")["status_str"] == "error", c.done("runs")



def _comfyui_parked_beside_an_llm(world, checkpoint_env: dict):
    """As :func:`_parked_comfyui_beside_a_busy_llm`, with the LLM idle and its minimum turn
    over: a wake of ComfyUI parks the LLM at once, by the stand-in cuda-checkpoint run with
    ``checkpoint_env`` (its test knobs: each call's delay, the copy's bytes a second)."""
    from .conftest import free_port
    d = world.berthd(policy={"min_turn": "0s", "ram_budget": "64GiB", "wait_limit": "30s"})
    d.env = {**d.env, **checkpoint_env}
    front = free_port()
    world.procs.append(berth_run(
        d, "llm", "--front", f"127.0.0.1:{front}", "--size", "14GiB", "--park", "checkpoint",
        "--checkpoint-path", str(BERTH) + "-sim-cuda-checkpoint", weights="13GiB",
        extra_engine=("--kv-per-token", "1MiB", "--tokens-per-s", "10")))
    wait_for(lambda: d.lease_of("llm") and d.lease_of("llm")["ready"], 20, "the LLM serving")
    c = world.comfyui("--disable-dynamic-vram")
    wait_for(lambda: d.state_of("comfyui") == "active" and c.berth()["gate"]["state"] == "open",
             10, "ComfyUI leased")
    assert d.call("POST", "/v1/operator/park", {"target": "comfyui"})[0] == 200
    wait_for(lambda: d.state_of("comfyui") == "parked" and c.berth()["gate"]["state"] == "asleep",
             20, "ComfyUI parked")
    left = d.status()["cards"][0]["available_bytes"]
    code, r = d.call("POST", "/v1/leases", {"engine": "filler", "priority": 9,
                                            "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": left}]})
    assert code == 201, r
    wait_for(lambda: d.state_of("filler") == "active", 10, "the filler granted")
    return d, c


def test_a_park_begun_for_a_withdrawn_wake_is_called_off_before_its_checkpoint(world):
    # Each cuda-checkpoint call takes 1.5 s: the park is begun (--get-state, lock) well
    # before its checkpoint.
    d, c = _comfyui_parked_beside_an_llm(world, {"BERTH_SIM_CHECKPOINT_HANG_S": "1.5"})
    held = c.post_in_thread("/prompt", {**prompt(FLUX), "prompt_id": "held-1"})
    wait_for(lambda: d.state_of("llm") == "parking", 20, "the LLM parking for ComfyUI")
    assert c.post("/queue", {"delete": ["held-1"]})[0] == 200
    _gone_within(d, 1.0)
    wait_for(lambda: d.state_of("llm") == "active", 30, "the LLM's park called off")
    held["thread"].join(10)
    assert held["status"] == 503 and held["body"]["error"]["details"] == "deleted", held
    assert SimCards(d.tmp / "sim").state_of(d.lease_of("llm")["pid"]) == "running"
    kinds = [(e["kind"], e.get("engine")) for e in d.timeline()]
    assert ("park.calloff", "llm") in kinds, kinds
    assert d.state_of("llm") == "active" and d.state_of("comfyui") == "parked", d.timeline()
    assert ("parked", "llm") not in kinds and ("park.off", "llm") in kinds, kinds
    assert c.berth()["gate"]["state"] == "asleep"
    assert "called off" in (d.tmp / "run-llm.log").read_text()
    assert d.sim_oom() == 0


def _checkpointing(pid: int) -> bool:
    """The stand-in cuda-checkpoint is copying ``pid`` out (``--action checkpoint`` runs)."""
    import psutil
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info.get("cmdline") or []
        if "checkpoint" in argv and str(pid) in argv and any("cuda-checkpoint" in a for a in argv):
            return True
    return False


def test_a_park_whose_checkpoint_began_runs_to_its_end_and_wakes_nobody(world):
    """Past the step that can be undone (the checkpoint copies out, about 7 s here), the park
    runs to its end; ComfyUI, whose wake was withdrawn, stays parked."""
    d, c = _comfyui_parked_beside_an_llm(world, {"BERTH_SIM_CHECKPOINT_BPS": "2e9"})
    held = c.post_in_thread("/prompt", {**prompt(FLUX), "prompt_id": "held-1"})
    pid = wait_for(lambda: d.lease_of("llm")["pid"], 10, "the LLM's pid")
    wait_for(lambda: _checkpointing(pid), 20, "the LLM's checkpoint under way")
    assert c.post("/queue", {"delete": ["held-1"]})[0] == 200
    _gone_within(d, 1.0)
    wait_for(lambda: d.state_of("llm") == "parked", 30, "the LLM's park at its end")
    held["thread"].join(10)
    assert held["status"] == 503 and held["body"]["error"]["details"] == "deleted", held
    kinds = [(e["kind"], e.get("engine")) for e in d.timeline()]
    assert ("wake.off", "comfyui") in kinds, kinds
    # Nothing wakes ComfyUI for the withdrawn prompt: it stays parked once the room is there.
    probe = berth_run(d, "probe", "--size", "1GiB", weights="512MiB")
    world.procs.append(probe)
    wait_for(lambda: d.state_of("probe") == "active", 20, "a later lease granted")
    assert d.state_of("comfyui") == "parked" and c.berth()["gate"]["state"] == "asleep"
    assert not [k for k in kinds[kinds.index(("wake.off", "comfyui")):]
                if k in (("resume", "comfyui"), ("grant", "comfyui"))], kinds
    assert d.sim_oom() == 0
