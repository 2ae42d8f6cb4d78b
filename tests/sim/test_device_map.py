"""Issue 35: the stand-in cuda-checkpoint restores a checkpointed engine onto another simulated
card of the same kind (``--device-map OLD_UUID=NEW_UUID``, driver 580+), refuses across kinds
with a clear reason (exit 801, the process left checkpointed, so the run can restart it instead),
and an older tool without the option is a usage error (the run detects it and restarts)."""

from __future__ import annotations

import pytest
from berth.sim.cards import CardSpec, SimCards, sim_uuid

from tests.sim.conftest import GiB, SimKit

GPU0, GPU1, GPU2 = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"


@pytest.fixture
def kit3(tmp_path, monkeypatch):
    """Three 24 GiB cards: gpu0 and gpu1 of one kind, gpu2 of another."""
    directory = tmp_path / "sim"
    monkeypatch.setenv("BERTH_SIM_DIR", str(directory))
    SimCards.init(directory, [CardSpec.make("gpu0", 24 * GiB, pci=GPU0, model="L4"),
                              CardSpec.make("gpu1", 24 * GiB, pci=GPU1, model="L4"),
                              CardSpec.make("gpu2", 24 * GiB, pci=GPU2, model="A10")],
                  free_delay_s=0.1)
    k = SimKit(directory, tmp_path)
    yield k
    k.close()


def _checkpointed(kit: SimKit, pid: int) -> int:
    """Checkpoint ``pid`` to host RAM; returns the bytes it held on gpu0."""
    held = kit.store.read(GPU0).processes[pid]
    for action in ("lock", "checkpoint"):
        r = kit.checkpoint("--action", action, "--pid", str(pid))
        assert r.returncode == 0, r.stderr
    assert kit.state(pid) == "checkpointed"
    return held


def test_a_checkpoint_restores_onto_another_card_of_the_same_kind(kit3):
    eng = kit3.start(weights="6GiB", card="gpu0")
    held = _checkpointed(kit3, eng.pid)
    r = kit3.checkpoint("--action", "restore", "--pid", str(eng.pid), "--device-map",
                        f"{sim_uuid(GPU0)}={sim_uuid(GPU1)}")
    assert r.returncode == 0, r.stderr
    assert kit3.checkpoint("--action", "unlock", "--pid", str(eng.pid)).returncode == 0
    assert kit3.store.read(GPU1).processes == {eng.pid: held}
    assert kit3.store.read(GPU0).processes == {}
    # Its later allocations (as its CUDA device now names gpu1) land on the new card.
    kit3.store.alloc(GPU0, 1 * GiB, pid=eng.pid)
    assert kit3.store.read(GPU1).processes == {eng.pid: held + GiB}
    assert kit3.store.read(GPU0).processes == {}


def test_a_restore_across_kinds_is_refused_with_its_reason_and_stays_checkpointed(kit3):
    eng = kit3.start(weights="6GiB", card="gpu0")
    held = _checkpointed(kit3, eng.pid)
    r = kit3.checkpoint("--action", "restore", "--pid", str(eng.pid), "--device-map",
                        f"{sim_uuid(GPU0)}={sim_uuid(GPU2)}")
    assert r.returncode == 801 % 256, r
    assert "gpu2 (A10)" in r.stderr and "gpu0 (L4)" in r.stderr and "same kind" in r.stderr
    assert kit3.state(eng.pid) == "checkpointed"
    assert kit3.store.read(GPU2).processes == {} and kit3.store.read(GPU0).processes == {}
    # A map that leaves a checkpointed card out, or names no card, is an invalid value (1).
    r = kit3.checkpoint("--action", "restore", "--pid", str(eng.pid), "--device-map",
                        f"{sim_uuid(GPU1)}={sim_uuid(GPU0)}")
    assert r.returncode == 1 and "every checkpointed card" in r.stderr, r
    r = kit3.checkpoint("--action", "restore", "--pid", str(eng.pid), "--device-map", "x=y")
    assert r.returncode == 1 and "--device-map" in r.stderr, r
    # ... and the process can still come back where it was.
    assert kit3.checkpoint("--action", "restore", "--pid", str(eng.pid)).returncode == 0
    assert kit3.store.read(GPU0).processes == {eng.pid: held}


def test_an_older_tool_without_device_map_is_a_usage_error(kit3):
    eng = kit3.start(weights="2GiB", card="gpu0")
    r = kit3.checkpoint("--action", "restore", "--pid", str(eng.pid), "--device-map",
                        f"{sim_uuid(GPU0)}={sim_uuid(GPU1)}",
                        env={"BERTH_SIM_CHECKPOINT_NO_DEVICE_MAP": "1"})
    assert r.returncode == 1 and "unrecognized arguments: --device-map" in r.stderr, r
    assert "--device-map" not in kit3.checkpoint(
        "--help", env={"BERTH_SIM_CHECKPOINT_NO_DEVICE_MAP": "1"}).stdout
    assert "--device-map" in kit3.checkpoint("--help").stdout
