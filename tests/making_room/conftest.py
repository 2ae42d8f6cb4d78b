"""Fixtures for the making-room tests (see :mod:`tests.making_room.world`)."""

from __future__ import annotations

import pytest

from tests.making_room.world import Live


@pytest.fixture
def live(tmp_path):
    """``live(cards=[("gpu0", "24GiB")], **policy)`` -> a started :class:`Live`; every process
    it started is killed at the end."""
    made: list[Live] = []

    def make(cards=(("gpu0", "24GiB"),), **policy) -> Live:
        lv = Live(tmp_path, list(cards), policy)
        made.append(lv)
        return lv.start()
    try:
        yield make
    finally:
        for lv in made:
            lv.close()
