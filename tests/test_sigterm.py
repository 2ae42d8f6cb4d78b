"""A pytest stopped by SIGTERM (``timeout``, a CI runner giving up) still stops the processes its
tests started, even one in a session of its own that no fixture has reached yet
(tests/conftest.py, "Stop on SIGTERM"). Run on a small suite of its own, alone and under
pytest-xdist (SIGTERM to the controller only)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import os, subprocess, sys, time
from pathlib import Path

def test_starts_a_process_then_hangs():
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path(os.environ["PID_FILE"]).write_text(str(p.pid))
    time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_pytest_stopped_by_sigterm_stops_what_its_tests_started(tmp_path, xdist):
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_hang.py").write_text(SUITE)
    pid_file = tmp_path / "pid"
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist,
         "--rootdir", str(tmp_path), f"--basetemp={tmp_path / 'base'}",
         str(tmp_path / "test_hang.py")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PID_FILE": str(pid_file),
             "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    started = None
    try:
        started = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60,
                               "the inner test to start its process"))
        inner.send_signal(signal.SIGTERM)
        assert inner.wait(30) == -signal.SIGTERM, inner.stdout.read().decode()
        wait_for(lambda: not _alive(started), 10, f"process {started} to be stopped")
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait(10)
        if started is not None and _alive(started):
            os.kill(started, signal.SIGKILL)
