"""Issue 35: a write that reaches a run moving by restart, before its new grant, is held.

A move by restart is a drain whose run asks for its card again at once, with no write held
(:meth:`berth.run.main.EngineRun._drained`). Seen under load in tests/making_room/test_move.py: a
write that came while that ask was on its way (the new lease had no id yet) made the front ask
for a wake of that lease, and the run answered it 503 "berthd is unavailable" though berthd was
up. The run here is in-process against a real berthd on two simulated cards, so that its new
lease request can be held at the client until the write has come: deterministic, where the
live window is a few milliseconds. The drain that moves it is the instruction berthd sends.
"""

from __future__ import annotations

import asyncio

from berth.client import Client
from berth.decide.instruction import Instruction
from berth.decide.model import Op
from berth.front import FrontState
from berth.run.cli import RunOptions
from berth.run.main import EngineRun

from tests.berthd import BERTH, Berthd, sim_config
from tests.helpers import ceiling, free_port, sweep
from tests.run.world import chat


async def _until(check, timeout_s: float, what: str):
    """Wait (inside the loop) until ``check()`` is truthy, within a ceiling scaled by the
    machine's slowness."""
    loop = asyncio.get_running_loop()
    end = loop.time() + ceiling(timeout_s)
    while not (got := check()):
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return got


def test_a_write_during_a_move_by_restart_is_held_until_the_engine_serves(tmp_path,
                                                                           monkeypatch):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB"), ("gpu1", "24GiB")])).start()
    for k in ("BERTH_STATE_DIR", "BERTH_SOCKET", "BERTH_SIM_DIR", "BERTH_CONFIG"):
        monkeypatch.setenv(k, d.env[k])
    real = Client.request_lease
    asks: list[asyncio.Event] = []
    gate: dict[str, asyncio.Event] = {}

    async def request_lease(self, body):
        asks.append(asyncio.Event())
        if len(asks) > 1:                  # the ask after the drain waits for the write
            await gate["open"].wait()
        return await real(self, body)
    monkeypatch.setattr(Client, "request_lease", request_lease)
    port = free_port()
    run = EngineRun(RunOptions(
        cmd=[BERTH, "sim", "engine", "--port", "{port}", "--weights", "3GiB", "--load-s", "0.1"],
        engine="B", sizes=[(None, "4GiB")], front=f"127.0.0.1:{port}"))

    async def go():
        gate["open"] = asyncio.Event()
        loop = asyncio.get_running_loop()
        main = asyncio.create_task(run.main())
        try:
            await _until(lambda: run.front and run.front.state is FrontState.OPEN, 60,
                         "B serving")
            pci = run.lease.cards[0]["pci"]
            other = next(c for c in ("0000:01:00.0", "0000:02:00.0") if c != pci)
            await run.actions.carry_out(Instruction(
                Op.DRAIN, (pci,), 1, reason="room for W; it moves to the other card",
                move_to=other))
            await _until(lambda: len(asks) > 1, 60, "B's run asking for its card again")
            held = loop.run_in_executor(None, lambda: chat(port, "B", timeout_s=120))
            await _until(lambda: run.front.wakes >= 1 and not run.front._wake_tasks, 30,
                         "the front's wake call done")
            # Held, not answered: before the fix the wake failed and the front went back to
            # asleep, answering the write 503 "berthd is unavailable".
            assert run.front.state is FrontState.WAKING and run.front.holding == 1, \
                run.front.counters()
            assert not held.done()
            gate["open"].set()
            answer = await asyncio.wait_for(held, ceiling(120))
            assert answer.finish_reason is not None and answer.text, answer
            assert run.lease.cards[0]["pci"] in (pci, other)
        finally:
            gate["open"].set()
            run._signalled()
            await asyncio.wait_for(main, ceiling(60))
    try:
        asyncio.run(go())
    finally:
        d.stop()
        sweep(tmp_path)
