"""A ``berth run`` that finds berthd starting waits for it rather than failing open (issue 37
"supervisord starts every program at once"): :mod:`berth.run.starting` finds a berthd process
of the run's socket, and :class:`~berth.run.failopen.FailOpen` measures nothing while it is
young and silent. The whole case, under a real supervisord: tests/hosts/supervisor/
test_autostart.py."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess

import pytest
from berth.run import starting

from tests.run.test_fail_open import _no_berthd


@pytest.mark.parametrize("argv, named", [
    (["/usr/bin/berthd"], True),
    (["/venv/bin/python", "/venv/bin/berthd", "--config", "b.toml"], True),
    (["/venv/bin/berth", "daemon"], True),
    (["/venv/bin/python3", "/venv/bin/berth", "-v", "daemon"], True),
    (["python3", "-m", "berth.cli", "daemon", "--config", "b.toml"], True),
    (["/venv/bin/berth", "run", "--engine", "a", "--", "berth", "daemon"], False),
    (["sh", "-c", "sleep 1; exec berth daemon"], False),
    (["/venv/bin/berth", "status"], False),
    ([], False),
])
def test_berthds_command_is_told_from_others(argv, named):
    assert (starting.is_berthd(argv) is not None) is named


@pytest.fixture
def fake_berthd(tmp_path):
    """A real process whose command is berthd's (``exec -a berthd``) and whose environment
    names the socket ``tmp_path/b.sock``; it never answers."""
    sock = tmp_path / "b.sock"
    env = {**os.environ, "BERTH_SOCKET": str(sock)}
    p = subprocess.Popen(["bash", "-c", "exec -a berthd sleep 300"], env=env)
    try:
        yield p, sock
    finally:
        p.kill()
        p.wait(10)


def _found(sock):
    from tests.helpers import wait_for
    return wait_for(lambda: starting.find(sock), 30, "the berthd process to show")


def test_a_berthd_of_the_runs_socket_is_found_and_one_of_another_is_not(fake_berthd, tmp_path):
    p, sock = fake_berthd
    up = _found(sock)
    assert up.pid == p.pid and 0 <= up.age_s < starting.STARTING_S, up
    assert starting.find(tmp_path / "other.sock") is None
    # Its --config names the socket when its environment does not (berth.toml's [api] socket).
    toml = tmp_path / "b.toml"
    toml.write_text(f'[api]\nsocket = "{tmp_path / "c.sock"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    q = subprocess.Popen(["bash", "-c", f"exec -a berthd bash -c 'sleep 300; :' --config {toml}"],
                         env=env)
    try:
        assert _found(tmp_path / "c.sock").pid == q.pid
    finally:
        q.kill()
        q.wait(10)


def test_the_run_waits_for_a_starting_berthd_then_decides_once_it_is_gone(
        fake_berthd, tmp_path, monkeypatch, caplog):
    from berth.client import BerthdUnavailable, Client
    from berth.run.cli import RunOptions
    from berth.run.failopen import FailOpen, Room
    p, sock = fake_berthd
    monkeypatch.setenv("BERTH_CONFIG", _no_berthd(tmp_path)["BERTH_CONFIG"])
    monkeypatch.setenv("BERTH_SOCKET", str(sock))
    _found(sock)
    o = RunOptions(cmd=["true"], engine="x", sizes=[(None, "1GiB")], start_limit_s=40.0)
    now = [0.0]
    run = FailOpen(o, clock=lambda: now[0], socket=sock)

    async def steps() -> list:
        client = Client()
        try:
            await client.status()
        except BerthdUnavailable as e:
            error = e
        finally:
            await client.close()
        out = [await run.step(error)]
        now[0] = 6.0                            # past the 5 s between two measures
        out.append(await run.step(error))
        out.append(run.lock)
        p.kill()
        p.wait(10)
        now[0] = 7.0
        out.append(await run.step(error))
        return out

    caplog.set_level(logging.INFO, logger="berth.run")
    first, second, lock, third = asyncio.run(steps())
    # 1 GiB fits the empty card, yet nothing is measured while berthd starts.
    assert first is False and second is False and lock is None
    assert isinstance(third, Room) and third.fits, third
    run.let_go("test")
    said = [r.getMessage() for r in caplog.records]
    assert sum("is still starting" in m for m in said) == 1, said      # said once
    assert f"berthd is not answering yet at {sock}: berthd (pid {p.pid}) started" in said[0]
    assert "x waits for it before deciding whether to start unleased" in said[0], said
    assert f"berthd (pid {p.pid}) exited without answering" in said[1], said
    assert "UNLEASED (fail-open)" in said[2], said


def test_a_berthd_silent_past_a_minute_after_its_start_counts_as_gone(fake_berthd):
    import time
    p, sock = fake_berthd
    _found(sock)
    up = starting.find(sock, now=time.time() + starting.STARTING_S + 1)
    assert up is not None and up.age_s > starting.STARTING_S
