"""The checkpoint plugin against the stand-in cuda-checkpoint and real stub engines on a
simulated 24 GiB card (tests/sim fixtures)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import psutil
import pytest

from berth_plugins import checkpoint
from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

from .conftest import PCI, GiB, MiB, ctx

CONTEXT = 256 * MiB   # the stub's default --residual
TOOL = [sys.executable, "-m", "berth.sim.checkpoint"]


@pytest.fixture
def pm(monkeypatch):
    monkeypatch.setenv("BERTH_SIM_CHECKPOINT_BPS", "1e12")   # moves take no noticeable time
    return make_plugin_manager(load_entry_points=False)


def cp_ctx(pids, held, **kw):
    kw.setdefault("options", {"checkpoint_path": TOOL})
    kw.setdefault("ram_available_bytes", 64 * GiB)
    return ctx("checkpoint", pids=pids, cards=[PCI], use_bytes={PCI: held}, **kw)


def act(pm, hook, c):
    return asyncio.run(run_action(pm, hook, c))


def test_park_moves_the_bytes_out_and_wake_restores_them(kit, pm):
    eng = kit.start(weights="2GiB")
    held = 2 * GiB + CONTEXT
    before = kit.driver.read(PCI)
    assert before.processes == {eng.pid: held}
    # a PID of the tree without CUDA (this test process) is skipped, not an error
    script = str(Path(sys.executable).parent / "berth-sim-cuda-checkpoint")
    act(pm, "berth_park", cp_ctx([os.getpid(), eng.pid], held,
                                 options={"checkpoint_path": script}))
    assert kit.state(eng.pid) == "checkpointed"
    parked = kit.driver.read(PCI)
    assert eng.pid not in parked.processes
    assert parked.free_bytes - before.free_bytes == held
    snap = {p.pid: p for p in kit.store.snapshot().procs}
    assert snap[eng.pid].host == {PCI: held}

    act(pm, "berth_wake", cp_ctx([eng.pid], held, room_confirmed=True))
    assert kit.state(eng.pid) == "running"
    assert kit.driver.read(PCI).processes == {eng.pid: held}
    assert eng.healthy()


def test_wake_without_confirmed_room_is_refused(kit, pm):
    eng = kit.start(weights="1GiB")
    held = 1 * GiB + CONTEXT
    act(pm, "berth_park", cp_ctx([eng.pid], held))
    with pytest.raises(MechanismError, match="restore refused: room not confirmed"):
        asyncio.run(checkpoint.berth_wake(cp_ctx([eng.pid], held, room_confirmed=False)))
    assert kit.state(eng.pid) == "checkpointed"


def test_a_hanging_tool_is_killed_at_the_bound(kit, pm, monkeypatch):
    eng = kit.start(weights="1GiB")
    monkeypatch.setenv("BERTH_SIM_CHECKPOINT_HANG_S", "30")
    with pytest.raises(MechanismError, match="did not finish within"):
        act(pm, "berth_park", cp_ctx([eng.pid], 1 * GiB + CONTEXT, timeout_s=1.5))
    tools = [p for p in psutil.Process().children(recursive=True)
             if "berth.sim.checkpoint" in " ".join(p.cmdline())]
    assert tools == []
    assert kit.state(eng.pid) == "running"


def test_park_refused_when_host_ram_cannot_hold_the_copy(kit, pm):
    eng = kit.start(weights="1GiB")
    with pytest.raises(MechanismError, match="host RAM cannot hold the checkpoint"):
        act(pm, "berth_park", cp_ctx([eng.pid], 1 * GiB + CONTEXT,
                                     ram_available_bytes=64 * MiB))
    with pytest.raises(MechanismError, match="unknown to the driver"):
        act(pm, "berth_park", ctx("checkpoint", pids=[eng.pid], use_bytes={PCI: None},
                                  options={"checkpoint_path": TOOL}))
    assert kit.state(eng.pid) == "running"


def test_unsupported_checkpoint_unlocks_and_the_engine_runs_on(kit, pm, monkeypatch):
    eng = kit.start(weights="1GiB")
    monkeypatch.setenv("BERTH_SIM_CHECKPOINT_UNSUPPORTED", "1")
    with pytest.raises(MechanismError) as e:
        act(pm, "berth_park", cp_ctx([eng.pid], 1 * GiB + CONTEXT))
    msg = str(e.value)
    assert "CUDA error 801 (not supported; exit status 33)" in msg
    assert "unlocked it again; the engine runs on" in msg
    assert e.value.exit_code == 801
    assert kit.state(eng.pid) == "running"


@pytest.mark.expect_oom
def test_restore_onto_a_full_card_says_the_engine_is_dead(kit, pm):
    first = kit.start(weights="14GiB")
    held = 14 * GiB + CONTEXT
    act(pm, "berth_park", cp_ctx([first.pid], held))
    kit.start(weights="14GiB")   # fits beside the checkpointed one
    with pytest.raises(MechanismError, match="out of memory.*stuck.*engine is dead") as e:
        act(pm, "berth_wake", cp_ctx([first.pid], held, room_confirmed=True))   # a wrong word
    assert e.value.exit_code == 2
    # a second restore is CUDA error 304 (exit status 48): dead as well
    with pytest.raises(MechanismError, match=r"CUDA error 304 \(OS call failed; exit status 48\)"
                                             ".*engine is dead"):
        act(pm, "berth_wake", cp_ctx([first.pid], held, room_confirmed=True))


def test_tool_not_found_is_clear(monkeypatch):
    monkeypatch.delenv("BERTH_CUDA_CHECKPOINT", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MechanismError, match="cuda-checkpoint not found"):
        checkpoint.tool_argv(ctx("checkpoint"))
    monkeypatch.setenv("BERTH_CUDA_CHECKPOINT", "/opt/cc")
    assert checkpoint.tool_argv(ctx("checkpoint")) == ["/opt/cc"]
    assert checkpoint.describe_status(145) == "CUDA error 401 (illegal state; exit status 145)"



def test_a_park_called_off_before_its_checkpoint_unlocks_and_the_engine_runs_on(kit, pm):
    """Issue 37: a park berthd has called off (``ctx.call_off`` set, here before it starts)
    takes its lock, then begins no checkpoint: the engine is unlocked and keeps its memory."""
    from berth_plugins.hookspecs import CalledOff
    eng = kit.start(weights="2GiB")
    held = 2 * GiB + CONTEXT

    async def park_called_off() -> None:
        off = asyncio.Event()
        off.set()
        await run_action(pm, "berth_park", cp_ctx([eng.pid], held, call_off=off))

    with pytest.raises(CalledOff) as e:
        asyncio.run(park_called_off())
    assert str(e.value) == (f"called off before its checkpoint began: the waiter it was for "
                            f"has gone (pid {eng.pid}: unlocked it again; the engine runs on)")
    assert kit.state(eng.pid) == "running"
    assert kit.driver.read(PCI).processes == {eng.pid: held}
    assert eng.healthy()


def test_a_park_and_a_wake_are_three_tool_calls_each_with_no_state_read_after_a_step(
        kit, pm, tmp_path):
    """A step that exits 0 has led to its state: no ``--get-state`` after it (each call starts a
    process that opens the driver). A park is get-state, lock, checkpoint; a wake get-state,
    restore, unlock; and a failed step is still followed by a read (test above: unlocked again)."""
    log = tmp_path / "calls"
    tool = tmp_path / "cuda-checkpoint"
    tool.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\nexec {' '.join(TOOL)} \"$@\"\n")
    tool.chmod(0o755)
    eng = kit.start(weights="1GiB")
    held = 1 * GiB + CONTEXT
    opts = {"checkpoint_path": str(tool)}
    act(pm, "berth_park", cp_ctx([eng.pid], held, options=opts))
    act(pm, "berth_wake", cp_ctx([eng.pid], held, options=opts, room_confirmed=True))
    calls = [line.split(" --pid")[0] for line in log.read_text().splitlines()]
    assert calls == ["--get-state", "--action lock", "--action checkpoint",
                     "--get-state", "--action restore", "--action unlock"]
    assert kit.state(eng.pid) == "running"
    assert eng.healthy()
