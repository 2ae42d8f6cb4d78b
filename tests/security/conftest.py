"""Fixtures for the security tests: second Unix users made by the test (created and removed by
it: the machine runs the tests as root), a berthd run by root whose socket they can reach, a
directory they can read, and ``berth run`` processes stopped whatever the outcome.

The user fixtures are the fault tests' (``tests/faults/conftest.py``), shared here."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.faults.conftest import make_user, public_dir, shared_berthd  # noqa: F401 (fixtures)


@pytest.fixture
def runs():
    """Processes a test started (each its own session): SIGTERM to the group, then SIGKILL."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
