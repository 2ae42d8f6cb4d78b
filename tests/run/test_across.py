"""Issue 35: whether a run's cuda-checkpoint restores onto another card (its ``--help`` names
``--device-map``: the stand-in's does, an older tool's does not), and the map a wake placed on
other cards gives the tool (every checkpointed card, old UUID to new, in the shares' order)."""

from __future__ import annotations

import asyncio

import pytest
from berth.run import across

from berth_plugins.checkpoint import supports_device_map
from tests.broker.conftest import CHECKPOINT


def test_the_stand_in_restores_across_and_an_older_tool_does_not(monkeypatch):
    assert asyncio.run(supports_device_map([CHECKPOINT])) is True
    monkeypatch.setenv("BERTH_SIM_CHECKPOINT_NO_DEVICE_MAP", "1")
    assert asyncio.run(supports_device_map([CHECKPOINT])) is False
    assert asyncio.run(supports_device_map(["/nonexistent/cuda-checkpoint"])) is False


def test_only_a_checkpoint_park_asks_and_a_refusal_ends_the_claim(monkeypatch):
    monkeypatch.setattr(across, "_known", {})
    monkeypatch.setattr(across, "_refused", [])
    assert asyncio.run(across.detect(None, CHECKPOINT, {})) is False
    assert asyncio.run(across.detect("hook", CHECKPOINT, {})) is False
    assert asyncio.run(across.detect("checkpoint", CHECKPOINT, {})) is True
    across.refused("CUDA error 801: not the same kind")
    assert asyncio.run(across.detect("checkpoint", CHECKPOINT, {})) is False


CARDS = {"0000:01:00.0": {"name": "gpu0", "uuid": "GPU-a"},
         "0000:02:00.0": {"name": "gpu1", "uuid": "GPU-b"},
         "0000:03:00.0": {"name": "gpu2", "uuid": "GPU-c"}}


def test_the_device_map_of_a_wake_on_other_cards():
    old = [{"pci": "0000:01:00.0", "uuid": "GPU-a"}, {"pci": "0000:02:00.0", "uuid": "GPU-b"}]
    assert across.device_map(old, ("0000:01:00.0", "0000:02:00.0"), CARDS) == {}
    assert across.device_map(old, ("0000:02:00.0", "0000:01:00.0"), CARDS) == \
        {"GPU-a": "GPU-b", "GPU-b": "GPU-a"}          # two shares that swap cards
    assert across.device_map(old, ("0000:01:00.0", "0000:03:00.0"), CARDS) == \
        {"GPU-a": "GPU-a", "GPU-b": "GPU-c"}          # every checkpointed card listed
    with pytest.raises(ValueError, match="no UUID"):
        across.device_map(old[:1], ("0000:09:00.0",), CARDS)
