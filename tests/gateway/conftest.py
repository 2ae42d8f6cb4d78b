"""Fixtures: ``machines(name, ...)`` makes :class:`tests.gateway.world.Machine` objects, all
stopped at the end, pass or fail."""

from __future__ import annotations

import pytest

from tests.gateway.world import Machine


@pytest.fixture
def machine(tmp_path):
    made: list[Machine] = []

    def make(name: str, **kw) -> Machine:
        m = Machine(tmp_path, name, **kw)
        made.append(m)
        return m
    yield make
    for m in reversed(made):
        m.stop()
