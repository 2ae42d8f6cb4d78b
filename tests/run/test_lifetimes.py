"""``berth run`` starts and stops through one exit stack (issue 23 "Lifetimes on exit
stacks"): whichever way a run ends, an error's included, its tasks are cancelled, its signal
handlers removed, its front closed, and an engine it started does not outlive it."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

import pytest
from berth.run.cli import RunOptions
from berth.run.main import EngineRun

from tests.helpers import sweep


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def no_berthd(tmp_path, monkeypatch):
    """berthd is not there (the run fails open at once); a valid config names the sim driver."""
    cfg = tmp_path / "berth.toml"
    cfg.write_text('[driver]\nkind = "sim"\n[[driver.cards]]\npci = "0000:01:00.0"\n'
                   'name = "gpu0"\ntotal = "24GiB"\n')
    for k, v in {"BERTH_CONFIG": cfg, "BERTH_STATE_DIR": tmp_path,
                 "BERTH_SOCKET": tmp_path / "absent.sock", "BERTH_SIM_DIR": tmp_path / "sim"
                 }.items():
        monkeypatch.setenv(k, str(v))
    import subprocess

    from tests.berthd import BERTH
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0", "--dir",
                    str(tmp_path / "sim")], check=True, capture_output=True)
    yield
    sweep(tmp_path)


def _run(port: int, code: str) -> EngineRun:
    return EngineRun(RunOptions(cmd=[sys.executable, "-c", code, "{port}"], engine="e",
                                sizes=[(None, "1GiB")], front=f"127.0.0.1:{port}",
                                term_grace_s=1.0))


async def _left_behind() -> tuple[list[asyncio.Task], bool]:
    """Tasks still pending besides this one, and whether a SIGTERM handler is still set."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    return tasks, asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)


def test_an_error_inside_the_run_cancels_its_tasks_and_stops_its_engine(no_berthd, monkeypatch):
    async def boom(self, deadline_s=None):
        raise RuntimeError("health check broke")
    monkeypatch.setattr("berth.run.engine.EngineProcess.until_healthy", boom)
    port = _port()
    run = _run(port, "import time; time.sleep(60)")

    async def go():
        with pytest.raises(RuntimeError, match="health check broke"):
            await run.main()
        return await _left_behind()
    tasks, handler = asyncio.run(go())
    assert tasks == [] and not handler
    assert run.engine.proc.returncode is not None, "the engine outlived the run's error"
    assert not _accepts(port)


def test_a_run_that_ends_removes_its_signal_handlers(no_berthd):
    port = _port()
    run = _run(port, "pass")

    async def go():
        return await run.main(), await _left_behind()
    code, (tasks, handler) = asyncio.run(go())
    assert code == 0 and tasks == [] and not handler
    assert not _accepts(port)
