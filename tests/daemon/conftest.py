"""Fixtures for berthd's tests: a real berthd on simulated cards, and ``berth run`` processes
killed (with their groups) whatever the outcome."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.berthd import Berthd, sim_config


@pytest.fixture
def berthd(tmp_path):
    made: list[Berthd] = []

    def make(cards=(("gpu0", "24GiB"),), **kw) -> Berthd:
        d = Berthd(tmp_path, sim_config(tmp_path, list(cards), **kw)).start()
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop()


@pytest.fixture
def runs():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)
