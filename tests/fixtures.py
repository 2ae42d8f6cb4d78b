"""The fixtures every live test shares (``tests/conftest.py`` makes them visible to every folder):
a berthd on simulated cards in the test's directory, one berthd a module's tests share, and the
``berth run`` processes a test starts.

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


@pytest.fixture(scope="module")
def shared_berthd(tmp_path_factory):
    """``shared_berthd(cards=(("gpu0", "24GiB"),), **config)`` -> a started :class:`Berthd` that
    every test of the module asking for the same ``cards`` and ``config`` (as for ``berthd``;
    other ones, another berthd) gets: one start for all of them, stopped at the module's end as
    ``berthd`` stops its own (what a test started with its ``env`` is swept then, not at the
    test's end: a test stops its own processes).

    Issue 38: each berthd start costs about 0.4 CPU-s, and the suite is CPU-bound on two cores;
    parametrized tests that only send berthd a request and check the answer started one a case.
    A test may share one only if it leaves nothing another could see (no lease left held: one
    it makes it releases, pass or fail) and reads nothing of berthd's lifetime (not killed or
    restarted, its log not read from the start, its timeline not counted). Mark such tests
    ``@pytest.mark.xdist_group(NAME)``: under ``--dist loadgroup`` a module's tests are
    otherwise spread over the workers, each starting its own."""
    made: dict[str, Berthd] = {}

    def get(cards=(("gpu0", "24GiB"),), **kw) -> Berthd:
        key = repr((tuple(cards), sorted(kw.items())))
        if key not in made:
            tmp = tmp_path_factory.mktemp("shared")
            d = Berthd(tmp, sim_config(tmp, list(cards), **kw))
            try:
                d.start()
            except BaseException:
                # The test that asked fails; the next one tries a fresh start, not a dead one.
                stop_all([d.proc], tmp)
                raise
            made[key] = d
        return made[key]
    yield get
    for d in made.values():
        stop_all([d.proc], d.tmp)


@pytest.fixture
def runs(tmp_path):
    """A list the test appends its ``berth run`` processes to (each started with
    ``start_new_session=True``, so its group is the run and its engine)."""
    procs: list[subprocess.Popen] = []
    yield procs
    stop_all(procs, tmp_path)
