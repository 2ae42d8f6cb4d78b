"""The ComfyUI node in the stand-in, with a real berthd (issue 13 acceptance, CI part)."""

from __future__ import annotations

import psutil

from berth.sim.comfyui import LOADERS as STAND_IN_LOADERS
from berth_hosts.comfyui.estimate import LOADERS
from tests.berthd import wait_for

from .conftest import prompt

SD15 = ("CheckpointLoaderSimple", "ckpt_name", "sd15.safetensors")
FLUX = ("UNETLoader", "unet_name", "flux-dev.safetensors")


def test_the_node_and_the_stand_in_know_the_same_loaders():
    assert LOADERS == STAND_IN_LOADERS


def test_loaded_as_comfyui_loads_it_registers_comfyui_pid_and_start_time(world):
    d = world.berthd()
    c = world.comfyui()
    le = wait_for(lambda: d.lease_of("comfyui"), 10, "ComfyUI's lease")
    assert le["pid"] == c.proc.pid
    assert abs(le["start_time"] - psutil.Process(c.proc.pid).create_time()) < 0.05
    assert le["capabilities"]["park"] == "hook"
    assert le["bound"] == "growth"
    assert le["shares"][0]["size_bytes"] == 20 << 30
    assert "BerthStatus" in c.get("/object_info")[1]
    # The node runs in a prompt, and reports the lease.
    code, ans = c.post("/prompt", prompt())
    assert code == 200, ans
    wait_for(lambda: c.done(ans["prompt_id"]), 10, "the prompt to finish")
    assert c.done(ans["prompt_id"])["status_str"] == "success"
    assert wait_for(lambda: c.berth()["lease"] == le["id"] and c.berth(), 10)["gate"]["state"] == "open"


def _parked(d, c):
    code, ans = d.call("POST", "/v1/operator/park", {"target": "comfyui"})
    assert code == 200, ans
    wait_for(lambda: d.state_of("comfyui") == "parked", 15, "ComfyUI parked")
    assert c.berth()["gate"]["state"] == "asleep"


def test_a_prompt_is_held_while_parked_and_passes_after_the_wake(world):
    d = world.berthd()
    c = world.comfyui()
    wait_for(lambda: d.state_of("comfyui") == "active" and c.berth()["gate"]["state"] == "open",
             10, "ComfyUI leased")
    code, ans = c.post("/prompt", prompt(SD15))
    wait_for(lambda: c.done(ans["prompt_id"]), 10, "the first prompt")
    _parked(d, c)
    held = c.post_in_thread("/api/prompt", prompt(SD15))
    wait_for(lambda: c.berth()["gate"]["held"] >= 1, 10, "the prompt held by the gate")
    # It was held (not queued) until berthd woke ComfyUI, then it passed and ran.
    held["thread"].join(20)
    assert held.get("status") == 200, held
    kinds = [e["kind"] for e in d.timeline()]
    assert "resume" in kinds or "wake" in kinds, kinds
    wait_for(lambda: d.state_of("comfyui") == "active", 10, "ComfyUI active again")
    st = wait_for(lambda: c.done(held["body"]["prompt_id"]), 10, "the held prompt to run")
    assert st["status_str"] == "success"
    assert d.sim_oom() == 0


def test_reads_pass_while_parked_and_wake_nothing(world):
    d = world.berthd()
    c = world.comfyui()
    wait_for(lambda: d.state_of("comfyui") == "active", 10, "ComfyUI leased")
    _parked(d, c)
    wakes = d.status()["counters"]["wakes"]
    for path in ("/queue", "/api/queue", "/prompt", "/api/prompt", "/system_stats",
                 "/object_info", "/api/system_stats"):
        code, _ = c.get(path)
        assert code == 200, path
    assert c.post("/free", {"unload_models": True})[0] == 200    # not a card-using write
    assert d.state_of("comfyui") == "parked"
    assert c.berth()["gate"] == {**c.berth()["gate"], "state": "asleep", "held": 0, "wakes": 0}
    assert d.status()["counters"]["wakes"] == wakes
    assert not d.status()["waiting"]


def test_a_park_waits_for_the_running_prompt(world):
    d = world.berthd()
    c = world.comfyui(step_s=0.05)
    wait_for(lambda: d.state_of("comfyui") == "active", 10, "ComfyUI leased")
    code, ans = c.post("/prompt", prompt(SD15, steps=40))          # about 2 s of sampling
    assert code == 200
    wait_for(lambda: c.get("/queue")[1]["queue_running"], 5, "the prompt to start")
    code, _ = d.call("POST", "/v1/operator/park", {"target": "comfyui"})
    assert code == 200
    wait_for(lambda: c.berth()["gate"]["state"] in ("closing", "asleep"), 5, "the gate to close")
    # While the prompt runs, ComfyUI is not parked and its models stay on the card.
    assert c.done(ans["prompt_id"]) is None
    assert d.state_of("comfyui") == "parking"
    wait_for(lambda: d.state_of("comfyui") == "parked", 15, "ComfyUI parked")
    st = c.done(ans["prompt_id"])
    assert st is not None and st["status_str"] == "success", st
    use = d.lease_of("comfyui")["shares"][0]["used_bytes"]
    assert use <= 300 << 20, use                    # the context only: the models left the card


def test_highvram_registers_without_park(world):
    d = world.berthd()
    c = world.comfyui("--highvram")
    le = wait_for(lambda: d.lease_of("comfyui"), 10, "ComfyUI's lease")
    assert le["capabilities"]["park"] is None
    assert "--highvram" in le["capabilities"]["front"]
    assert c.berth()["unloading_defeated_by"] == "--highvram"
    wait_for(lambda: "unloading frees nothing" in c.log.read_text(), 5, "the log to say why")
    # An operator park cannot be carried out: berthd refuses it for an engine without park.
    code, _ = d.call("POST", "/v1/operator/park", {"target": "comfyui"})
    assert d.state_of("comfyui") == "active"


def test_berthd_down_comfyui_keeps_working(world):
    world.no_berthd()
    c = world.comfyui()
    wait_for(lambda: "unleased" in c.berth()["health"], 10, "the node to say it is unleased")
    assert c.berth()["gate"]["state"] == "off"
    code, ans = c.post("/prompt", prompt(SD15))
    assert code == 200, ans
    st = wait_for(lambda: c.done(ans["prompt_id"]), 10, "the prompt to run unleased")
    assert st["status_str"] == "success"
