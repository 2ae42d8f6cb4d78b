"""The simulation kit's short processes load only what they use (issue 38): the stand-in
cuda-checkpoint runs once per park and wake step, and the suite starts hundreds of stub engines,
so a module loaded and not used costs the suite its CPU on every start."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
from berth.sim.store import start_time

from tests.berthd import BIN

#: Nothing the stand-in cuda-checkpoint does needs an event loop, an HTTP library, the config
#: schema or the decision model's dataclasses; nor psutil, whose import was a third of its start
#: (a process's start time is read from /proc as psutil reads it); nor typing, a tenth of its
#: start, which its modules use for annotations only.
NOT_FOR_CHECKPOINT = ("asyncio", "aiohttp", "pydantic", "prometheus_client", "berth.decide.model",
                      "berth.config.models", "psutil", "typing")


def _imported(argv: list[str], env: dict) -> tuple[set[str], str]:
    """The modules ``argv`` imports, as ``-X importtime`` lists them, and its stdout."""
    p = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    return {line.rpartition("|")[2].strip() for line in p.stderr.splitlines()
            if line.startswith("import time:")}, p.stdout


def _under(found: set[str], tops: tuple[str, ...]) -> list[str]:
    return sorted(m for m in found if any(m == t or m.startswith(t + ".") for t in tops))


def test_the_checkpoint_tools_get_state_loads_no_event_loop_nor_schema(kit):
    eng = kit.start(weights="1GiB")
    found, out = _imported([str(BIN / "berth-sim-cuda-checkpoint"), "--get-state", "--pid",
                            str(eng.pid)], kit.env)
    assert out.strip() == "running"                  # it did its work
    assert "berth.sim.cards" in found                # the reading is not vacuous
    assert not _under(found, NOT_FOR_CHECKPOINT), _under(found, NOT_FOR_CHECKPOINT)


def test_sim_cards_loads_no_stand_in(kit):
    """``berth sim cards`` and ``berth sim engine`` build only their own subcommand's flags:
    the Ollama and ComfyUI stand-ins (and aiohttp, for ``cards``) stay unloaded."""
    found, out = _imported([str(BIN / "berth"), "sim", "cards"], kit.env)
    assert "gpu0" in out and "berth.sim.cards" in found
    stand_ins = ("aiohttp", "berth.sim.ollama", "berth.sim.comfyui", "berth.sim.charge")
    assert not _under(found, stand_ins), _under(found, stand_ins)
    found, out = _imported([str(BIN / "berth"), "sim", "engine", "--help"], kit.env)
    assert "--weights SIZE" in out
    assert not _under(found, stand_ins[1:]), _under(found, stand_ins[1:])


def test_a_start_time_is_psutils_to_the_bit_and_none_for_a_zombie_or_a_gone_process():
    """The sim's keys (PID, start time) are written and read by processes that all call
    :func:`berth.sim.store.start_time`; it reads /proc itself, and must still give psutil's
    value (the key a reader of another version would compute)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert start_time(child.pid) == psutil.Process(child.pid).create_time()
        assert start_time(1) == psutil.Process(1).create_time()
        child.stdin.close()
        deadline = time.monotonic() + 60
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert start_time(child.pid) is None           # exited, not yet reaped
    finally:
        child.wait(30)
    assert start_time(child.pid) is None or psutil.pid_exists(child.pid)   # reaped: gone
