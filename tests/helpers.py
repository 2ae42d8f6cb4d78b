"""Helpers every test folder shares: one poll with a deadline, one sweep of a test's processes.

Nothing sleeps to synchronise: a wait polls an observable condition until a deadline, and the
deadline only bounds a failure (a passing test returns as soon as the condition holds).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

__all__ = ["wait_for", "ours", "sweep"]


def wait_for(check, timeout_s: float = 20.0, what: str = "condition", every_s: float = 0.02):
    """Call ``check()`` every ``every_s`` seconds until it returns something truthy, and return
    that. Raises ``AssertionError`` after ``timeout_s`` seconds, naming ``what`` and the last
    value."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} "
                                 f"(last: {last!r})")
        time.sleep(every_s)


def ours(tmp: Path) -> list[psutil.Process]:
    """Every process started for this test: its environment names a state dir at or under
    ``tmp`` (``berth demo`` and the bench make theirs under ``$TMPDIR``, which tests set to
    ``tmp``). The test process itself is not one of them."""
    root = str(tmp)
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            state = p.environ().get("BERTH_STATE_DIR", "")
        except (psutil.Error, OSError):
            continue
        if state == root or state.startswith(root + os.sep):
            found.append(p)
    return found


def sweep(tmp: Path) -> None:
    """SIGKILL every process :func:`ours` finds under ``tmp`` and reap them (5 s at most)."""
    left = ours(tmp)
    for p in left:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
