"""Fixtures for the ``berth run`` acceptance tests: :class:`tests.run.world.World` objects whose
processes are all killed at the end, pass or fail."""

from __future__ import annotations

import pytest

from tests.helpers import sweep
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
    for w in made:
        for m in w.models:
            m.kill()
        w.d.stop()
    sweep(tmp_path)


@pytest.fixture
def world(make_world) -> World:
    return make_world()
