"""The simulated-card store and ``berth sim init|cards``, in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from berth.cli import main as berth
from berth.driver import DriverError
from berth.driver.cuda import cuda_error_of
from berth.sim.cards import CardSpec, SimBusy, SimCards, SimError, SimOOM, sim_uuid
from berth.sim.driver import SimDriver

from tests.helpers import wait_for

from .conftest import GiB, MiB

A, B = "0000:01:00.0", "0000:41:00.0"


def _specs(baseline: int = 0) -> list[CardSpec]:
    return [CardSpec.make("gpu0", 24 * GiB, pci=A, baseline_bytes=baseline),
            CardSpec.make("gpu1", 48 * GiB, pci="00000000:41:00.0")]


@pytest.fixture
def store(tmp_path):
    return SimCards.init(tmp_path / "sim", _specs(baseline=400 * MiB), free_delay_s=0.2)


def test_spec_defaults_and_bad_input():
    s = CardSpec.make("gpu3", GiB, index=3)
    assert s.pci == "0000:04:00.0" and s.uuid == sim_uuid("0000:04:00.0")
    assert sim_uuid("0000:41:00.0") == "GPU-5e1a0000-0000-0000-0000-000000041000"
    with pytest.raises(ValueError, match="baseline_bytes"):
        CardSpec.make("gpu0", GiB, baseline_bytes=2 * GiB)
    with pytest.raises(ValueError, match="card name"):
        CardSpec.make("gpu 0", GiB)
    with pytest.raises(ValueError, match="pci"):
        CardSpec.make("gpu0", GiB, pci="nowhere")


def test_init_is_idempotent_and_refuses_different_cards(store, tmp_path):
    store.alloc(A, GiB)
    again = SimCards.init(tmp_path / "sim", _specs(baseline=400 * MiB), free_delay_s=0.2)
    assert again.read(A).processes == {os.getpid(): GiB}   # allocations kept
    with pytest.raises(SimError, match="declared differently"):
        SimCards.init(tmp_path / "sim", [CardSpec.make("gpu0", 16 * GiB, pci=A)])
    with pytest.raises(SimError, match="still hold"):
        SimCards.init(tmp_path / "sim", [CardSpec.make("gpu0", 16 * GiB, pci=A)], replace=True)
    store.release()
    SimCards.init(tmp_path / "sim", [CardSpec.make("gpu0", 16 * GiB, pci=A)], replace=True)
    assert store.read(A).spec.total_bytes == 16 * GiB
    with pytest.raises(ValueError, match="twice"):
        SimCards.init(tmp_path / "x", [CardSpec.make("gpu0", GiB, pci=A),
                                       CardSpec.make("gpu0", GiB, pci=B)])


@pytest.mark.expect_oom
def test_alloc_free_and_oom_counting(store):
    st = store.read(A)
    assert st.free_bytes == 24 * GiB - 400 * MiB and st.used_bytes == 400 * MiB
    store.alloc(A, 20 * GiB)
    with pytest.raises(SimOOM, match=r"CUDA out of memory\. Tried to allocate 4\.00 GiB \(GPU 0; "
                                     r"24\.00 GiB total capacity") as e:
        store.alloc(A, 4 * GiB)
    assert isinstance(e.value, MemoryError) and e.value.requested_bytes == 4 * GiB
    assert store.read(A).oom_events == 1 and store.read(B).oom_events == 0
    store.free(A, 5 * GiB)
    store.alloc(A, 4 * GiB)
    assert store.read(A).processes == {os.getpid(): 19 * GiB}
    with pytest.raises(SimError, match="cannot free"):
        store.free(A, 20 * GiB)
    with pytest.raises(SimError, match="nbytes"):
        store.alloc(A, -1)
    with pytest.raises(SimError, match="no simulated card at 0000:09:00.0"):
        store.alloc("09:00.0", 1)
    assert store.release() == 19 * GiB
    assert store.read(A).processes == {}


def test_gone_process_frees_after_the_delay_from_the_first_read_that_saw_it(store):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store.alloc(B, 8 * GiB, pid=child.pid)
    finally:
        child.kill()
        child.wait()
    seen = time.monotonic()
    first = store.read(B)
    assert first.processes == {child.pid: 8 * GiB}   # gone, but not freed yet
    freed = wait_for(lambda: store.read(B).processes == {} and time.monotonic(), what="the free")
    assert freed - seen >= 0.2


def test_checkpoint_states_and_a_blocked_alloc(store):
    store.alloc(A, 2 * GiB)
    pid = os.getpid()
    assert store.state_of(pid) == "running"
    store.lock(pid)
    with pytest.raises(SimBusy):
        store.alloc(A, 1, block=False)
    assert store.checkpoint(pid) == 2 * GiB
    assert store.read(A).processes == {} and store.bytes_of(pid) == 2 * GiB
    with pytest.raises(SimError) as e:
        store.unlock(pid)
    assert e.value.cuda_error == 401
    assert store.restore(pid) == 2 * GiB
    store.unlock(pid)
    assert store.read(A).processes == {pid: 2 * GiB}
    assert store.state_of(12345678) is None
    assert cuda_error_of(304 & 0xFF) == 304 and cuda_error_of(7) is None


def test_resolve_by_pci_name_uuid_or_index(store):
    assert store.resolve("gpu1").pci == B
    assert store.resolve("41:00.0").name == "gpu1"
    assert store.resolve(sim_uuid(A)).name == "gpu0"
    assert store.resolve("1").name == "gpu1"
    with pytest.raises(SimError, match="no simulated card 'gpu7'"):
        store.resolve("gpu7")


def test_sim_driver_reads_and_errors(store, tmp_path):
    d = SimDriver(tmp_path / "sim")
    cards = d.cards()
    assert [(c.pci, c.total_bytes) for c in cards] == [(A, 24 * GiB), (B, 48 * GiB)]
    assert cards[0].uuid == sim_uuid(A)
    store.alloc(B, GiB)
    r = d.read("00000000:41:00.0")
    assert r.pci == B and r.processes == {os.getpid(): GiB} and r.free_bytes == 47 * GiB
    with pytest.raises(DriverError) as e:
        d.read("0000:09:00.0")
    assert e.value.pci == "0000:09:00.0"
    with pytest.raises(DriverError, match="berth sim init"):
        SimDriver(tmp_path / "empty").cards()
    (tmp_path / "sim" / "cards.json").write_text("{broken")
    with pytest.raises(DriverError, match="corrupt"):
        d.read(A)


def test_cli_init_and_cards(tmp_path, capsys):
    d = str(tmp_path / "cli")
    assert berth(["sim", "init", "--dir", d, "--card", "gpu0=24GiB", "--card",
                  "big=80GiB@0000:81:00.0", "--baseline", "512MiB", "--free-delay", "1s"]) == 0
    out = capsys.readouterr().out
    assert "gpu0" in out and "0000:81:00.0" in out and "GPU-5e1a0000-" in out
    SimCards(d).alloc("0000:81:00.0", 10 * GiB)
    assert berth(["sim", "cards", "--dir", d, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    big = data["cards"][1]
    assert big["name"] == "big" and big["used_bytes"] == 10 * GiB + 512 * MiB
    assert data["free_delay_s"] == 1.0
    assert berth(["sim", "cards", "--dir", d]) == 0
    assert f"{os.getpid()} 10.0GiB running" in capsys.readouterr().out
    assert berth(["sim", "init", "--dir", d, "--card", "gpu0"]) == 2
    assert "--card" in capsys.readouterr().err
    assert berth(["sim", "init", "--dir", d, "--card", "gpu0=lots"]) == 2
    assert "'lots'" in capsys.readouterr().err


def test_cli_init_into_a_directory_that_cannot_be_made_says_so(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert berth(["sim", "init", "--dir", str(blocker / "sim"), "--card", "gpu0=24GiB"]) == 2
    err = capsys.readouterr().err
    assert f"--dir {blocker / 'sim'}: cannot create it" in err, err
