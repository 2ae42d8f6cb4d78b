"""Run and engine faults (issue 18): ``berth run`` killed with SIGKILL while its engine is its
child or its grandchild (behind a shell wrapper) under a parent that adopts orphans and does
not reap them at once. The engine's whole group must die with the run, the watchdog must take
the zombie of its own engine leader for what it is (not a reused PID), and the lease must end
so the card is free."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.berthd import BERTH, wait_for

REAPER = str(Path(__file__).with_name("reaper.py"))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _sim_engine_under(pid: int) -> int | None:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            cmd = k.cmdline()
        except psutil.Error:
            continue
        if "sim" in cmd and "engine" in cmd and "run" not in cmd and cmd[0] != "sh":
            return k.pid
    return None


@pytest.mark.parametrize("shape", ["child", "grandchild"])
def test_sigkill_of_berth_run_takes_the_engine_group(berthd, shape):
    d = berthd(cards=(("gpu0", "24GiB"),))
    engine = [BERTH, "sim", "engine", "--port", "{port}", "--weights", "4GiB", "--load-s", "0.1"]
    if shape == "grandchild":          # `; true` keeps the shell from exec-ing the engine
        engine = ["sh", "-c", " ".join(engine) + "; true"]
    cmd = [BERTH, "run", "--engine", "e", "--size", "6GiB", "--", *engine]
    harness = subprocess.Popen([sys.executable, REAPER, *cmd], env=d.env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    sigkill_run_and_check(d, harness, f"the engine ({shape})")


def sigkill_run_and_check(d, harness: subprocess.Popen, who: str, uid: int | None = None) -> None:
    """SIGKILL the ``berth run`` that ``harness`` (reaper.py) started for lease ``e``, and check
    that its engine (owned by ``uid`` when given) dies with it, the lease ends and the card is
    free again; whatever happens, the harness and what it started are ended."""
    try:
        run_pid = int(harness.stdout.readline())
        wait_for(lambda: (d.lease_of("e") or {}).get("pid"), 60, f"{who} to attach")
        eng = wait_for(lambda: _sim_engine_under(run_pid), 30, f"{who}'s pid")
        if uid is not None:
            assert psutil.Process(eng).uids().real == uid
        lid = d.lease_of("e")["id"]
        psutil.Process(run_pid).send_signal(signal.SIGKILL)
        wait_for(lambda: _gone(eng), 30, f"{who} {eng} to die with its run")
        wait_for(lambda: d.lease_of("e") is None, 60, f"lease {lid} to end")
        used = sum(c.get("used_bytes") or 0 for c in d.status()["cards"])
        assert used < 1 << 30, d.status()["cards"]
    finally:
        for p in psutil.Process(harness.pid).children(recursive=True):
            try:
                p.kill()
            except psutil.Error:       # already gone: nothing to end
                pass
        harness.stdin.close()
        harness.wait(10)
