"""Ctrl-C in a command that has no stop of its own ends it with 130 and no traceback (review
finding: `berth llama-swap wrap -` waiting on stdin printed a KeyboardInterrupt traceback)."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
from pathlib import Path

from tests.berthd import BERTH
from tests.helpers import sigint_as_a_terminal, wait_for

#: read(2)'s number; elsewhere only its first argument, fd 0, is looked at.
_READ = {"x86_64": "0", "aarch64": "63"}.get(platform.machine())


def _reads_stdin(pid: int) -> bool:
    """Whether ``pid`` is blocked in read(2) on fd 0 (``/proc/PID/syscall``: number, then fd)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == (_READ or fields[0]) and fields[1] == "0x0"


def test_ctrl_c_of_wrap_reading_stdin_exits_130_without_a_traceback():
    r, w = os.pipe()                         # stdin held open: wrap waits in its read
    p = subprocess.Popen([BERTH, "llama-swap", "wrap", "-"], stdin=r, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_a_terminal)
    os.close(r)
    try:
        wait_for(lambda: _reads_stdin(p.pid), what="wrap reading its stdin")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        os.close(w)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
