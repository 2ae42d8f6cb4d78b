"""``berth run``'s watchdog, a process per engine start, loads psutil only for an engine group
that is still there when the run goes: at the usual end the run has stopped its engine, and
psutil's import was most of the watchdog's start-up CPU."""

from __future__ import annotations

import subprocess
import sys


def _imported(argv: list[str]) -> tuple[set[str], subprocess.CompletedProcess]:
    p = subprocess.run([sys.executable, "-X", "importtime", *argv], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    return {line.rpartition("|")[2].strip() for line in p.stderr.splitlines()
            if line.startswith("import time:")}, p


def test_the_watchdog_of_a_gone_group_exits_without_psutil():
    gone = subprocess.Popen(["true"])
    gone.wait()
    found, p = _imported(["-m", "berth.run.watchdog", str(gone.pid), "1.0"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "killed" not in p.stderr
    assert "berth.run" in found                          # the reading is not vacuous
    assert not {"psutil", "berth.process"} & found, sorted({"psutil", "berth.process"} & found)


def test_the_watchdog_kills_a_group_that_is_still_there():
    engine = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        import psutil
        start = psutil.Process(engine.pid).create_time()
        p = subprocess.run([sys.executable, "-m", "berth.run.watchdog", str(engine.pid),
                            repr(start)], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-2000:]
        assert f"killed engine group {engine.pid}" in p.stderr
        assert engine.wait(30) == -9
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait(30)
