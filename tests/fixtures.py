"""The fixtures every live test shares (``tests/conftest.py`` makes them visible to every folder):
a berthd on simulated cards in the test's directory, and the ``berth run`` processes a test
starts.

At the end, pass or fail, what they started is stopped one way (:func:`tests.helpers.stop_all`):
each process group killed and reaped, then a sweep of every process whose environment names the
test's directory (engines a run left, checkpoint tools, watchdogs)."""

from __future__ import annotations

import subprocess

import pytest

from tests.berthd import Berthd, sim_config
from tests.helpers import stop_all


@pytest.fixture
def berthd(tmp_path):
    """``berthd(cards=(("gpu0", "24GiB"),), start=True, **config)`` -> a :class:`Berthd` in
    ``tmp_path`` (started unless ``start=False``); ``config`` goes to
    :func:`tests.berthd.sim_config` (``reserve``, ``policy``, ``extra``, ``free_delay``,
    ``checkpoint_rate``)."""
    made: list[Berthd] = []

    def make(cards=(("gpu0", "24GiB"),), start: bool = True, **kw) -> Berthd:
        d = Berthd(tmp_path, sim_config(tmp_path, list(cards), **kw))
        made.append(d)
        return d.start() if start else d
    yield make
    stop_all([d.proc for d in made], tmp_path)


@pytest.fixture
def runs(tmp_path):
    """A list the test appends its ``berth run`` processes to (each started with
    ``start_new_session=True``, so its group is the run and its engine)."""
    procs: list[subprocess.Popen] = []
    yield procs
    stop_all(procs, tmp_path)
