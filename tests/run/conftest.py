"""Fixtures for the ``berth run`` acceptance tests: :class:`tests.run.world.World` objects whose
processes are all killed at the end, pass or fail."""

from __future__ import annotations

import pytest

from tests.helpers import stop_all
from tests.run.world import World


@pytest.fixture
def make_world(tmp_path):
    """``make_world(**config)`` -> a :class:`World` (see :func:`tests.run.world.config`)."""
    made: list[World] = []

    def make(**cfg) -> World:
        w = World(tmp_path, **cfg)
        made.append(w)
        return w
    yield make
    stop_all([m.proc for w in made for m in w.models] + [w.d.proc for w in made], tmp_path)


@pytest.fixture
def world(make_world) -> World:
    return make_world()
