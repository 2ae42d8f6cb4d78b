"""The NVML driver against a patched ``pynvml`` module (no library or GPU needed)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest
from berth.decide.model import normalize_pci
from berth.driver import DriverError, PidsGone, confirm
from berth.driver.nvml import NvmlDriver, map_host_pids

GiB = 1 << 30
NOT_AVAILABLE = (1 << 64) - 1


@dataclass
class FakeCard:
    bus_id: str | bytes
    total: int = 24 * GiB
    free: int = 20 * GiB
    compute: list = field(default_factory=list)
    graphics: list = field(default_factory=list)
    mig: object = None     # None: NOT_SUPPORTED; else [current, pending]
    lost: bool = False
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    name: str = "NVIDIA GeForce RTX 4090"

    @property
    def pci(self) -> str:
        return normalize_pci(self.bus_id)


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Patches pynvml's functions; ``calls`` records (function, argument)."""

    def __init__(self, monkeypatch, cards: list[FakeCard], *, init_error: int | None = None,
                 v2: bool = True, getters: tuple[str, ...] = ("_v3", "_v2", "")):
        self.cards, self.calls, self.v2 = cards, [], v2
        self.process_error: int | None = None
        mp = monkeypatch

        def init():
            if init_error is not None:
                raise err(init_error)

        def by_bus(bus):
            self.calls.append(("by_bus", bus))
            for c in self.cards:
                if c.pci == normalize_pci(bus):
                    return c
            raise err(pynvml.NVML_ERROR_NOT_FOUND)

        def by_index(i):
            self.calls.append(("by_index", i))
            return self.cards[i]

        def memory(h, version=None):
            if h.lost:
                raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
            if version and not self.v2:
                raise err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            self.calls.append(("memory", "v2" if version else "v1"))
            return SimpleNamespace(total=h.total, free=h.free, used=h.total - h.free)

        def mig(h):
            if h.mig is None:
                raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return h.mig

        mp.setattr(pynvml, "nvmlInit", init)
        mp.setattr(pynvml, "nvmlShutdown", lambda: self.calls.append(("shutdown", None)))
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.cards))
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", by_index)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByPciBusId", by_bus)
        mp.setattr(pynvml, "nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=h.bus_id))
        mp.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: h.uuid)
        mp.setattr(pynvml, "nvmlDeviceGetName", lambda h: h.name)
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
        mp.setattr(pynvml, "nvmlDeviceGetMigMode", mig)
        for kind in ("Compute", "Graphics"):
            for v in ("_v3", "_v2", ""):
                name = f"nvmlDeviceGet{kind}RunningProcesses{v}"
                if v in getters:
                    mp.setattr(pynvml, name, self._getter(kind, v))
                elif v in ("_v3", ""):   # a driver without this symbol
                    mp.setattr(pynvml, name, self._missing)
                else:                     # a binding without this function
                    mp.delattr(pynvml, name, raising=False)

    def _missing(self, h):
        raise err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _getter(self, kind: str, v: str):
        def get(h):
            self.calls.append(("processes", kind + v))
            if self.process_error is not None:
                raise err(self.process_error)
            return [SimpleNamespace(pid=pid, usedGpuMemory=used)
                    for pid, used in (h.compute if kind == "Compute" else h.graphics)]
        return get


CARD_A = "00000000:05:00.0"        # NVML busId spelling
CARD_B = b"0000:0A:00.0"           # busIdLegacy spelling, as bytes from an old binding


def test_cards_normalise_both_bus_id_spellings(monkeypatch):
    FakeNvml(monkeypatch, [FakeCard(CARD_B, total=48 * GiB, free=40 * GiB), FakeCard(CARD_A)])
    d = NvmlDriver()
    cards = d.cards()
    assert [(c.pci, c.total_bytes, c.free_bytes, c.index) for c in cards] == [
        ("0000:05:00.0", 24 * GiB, 20 * GiB, 1), ("0000:0a:00.0", 48 * GiB, 40 * GiB, 0)]
    assert cards[0].model == "NVIDIA GeForce RTX 4090" and cards[0].uuid.startswith("GPU-")
    for spelling in ("0000:05:00.0", "00000000:05:00.0", "05:00.0", b"00000000:05:00.0"):
        assert d.read(spelling).pci == "0000:05:00.0"
    assert d.read("0000:0A:00.0").free_bytes == 40 * GiB


def test_reads_take_handles_by_bus_id_never_by_index(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeCard(CARD_A)])
    d = NvmlDriver()
    d.cards()
    fake.calls.clear()
    d.read("0000:05:00.0")
    assert not any(name == "by_index" for name, _ in fake.calls)
    d2 = NvmlDriver()   # a read before any discovery asks NVML by bus ID
    d2.read("05:00.0")
    assert ("by_bus", "0000:05:00.0") in fake.calls
    with pytest.raises(DriverError, match="no NVIDIA card at 0000:06:00.0") as e:
        d2.read("0000:06:00.0")
    assert e.value.pci == "0000:06:00.0"
    with pytest.raises(DriverError, match="pci"):
        d2.read("not-a-pci")


def test_reads_use_memory_v2_and_free_is_the_ground_truth(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeCard(CARD_A, free=7 * GiB, compute=[(4242, 3 * GiB)])])
    r = NvmlDriver().read(CARD_A)
    assert r.free_bytes == 7 * GiB and r.total_bytes == 24 * GiB
    assert r.processes == {4242: 3 * GiB} and r.processes_known
    assert ("memory", "v2") in fake.calls and ("processes", "Compute_v3") in fake.calls
    assert r.at <= time.monotonic()


def test_unknown_per_process_memory_is_none_never_zero(monkeypatch):
    FakeNvml(monkeypatch, [FakeCard(CARD_A, compute=[(10, None), (11, NOT_AVAILABLE), (12, 0),
                                                     (13, GiB)])])
    r = NvmlDriver().read(CARD_A)
    assert r.processes == {10: None, 11: None, 12: None, 13: GiB}
    assert r.use_of({13}) == GiB and r.use_of({10, 13}) is None and r.use_of({99}) == 0


def test_process_list_not_supported_leaves_only_free_bytes(monkeypatch):
    card = FakeCard(CARD_A, free=10 * GiB, compute=[(77, GiB)])
    fake = FakeNvml(monkeypatch, [card])
    fake.process_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    d = NvmlDriver()
    r = d.read(CARD_A)
    assert r.processes == {} and not r.processes_known and r.use_of({77}) is None
    gone = PidsGone(frozenset({77}), expect_bytes=GiB, free_before=10 * GiB)
    # an empty list is no proof: only the free bytes rising can confirm
    assert asyncio.run(confirm(d, CARD_A, gone, deadline=time.monotonic())) is None
    card.free = 11 * GiB
    assert asyncio.run(confirm(d, CARD_A, gone, deadline=time.monotonic())) is not None


def test_compute_and_graphics_processes_are_merged(monkeypatch):
    FakeNvml(monkeypatch, [FakeCard(CARD_A, compute=[(1, GiB), (2, None)],
                                    graphics=[(2, 2 * GiB), (3, 300 << 20), (1, GiB)])])
    assert NvmlDriver().read(CARD_A).processes == {1: GiB, 2: 2 * GiB, 3: 300 << 20}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                                  pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_names_the_sim_driver(monkeypatch, code):
    FakeNvml(monkeypatch, [], init_error=code)
    with pytest.raises(DriverError) as e:
        NvmlDriver()
    msg = str(e.value)
    assert "no NVIDIA driver was found" in msg and 'kind = "sim"' in msg and "berth.toml" in msg
    # `berth sim init` alone leaves berthd on NVML (its cards come from berth.toml), so the
    # hint must not offer it as the way out, as it did ("or run `berth sim init ...`").
    assert "berth sim init" not in msg and "[[driver.cards]]" in msg
    assert "core/examples/berth.toml" in msg


def test_uninitialised_library_mid_read_names_the_sim_driver(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeCard(CARD_A)])
    fake.process_error = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(DriverError, match='kind = "sim"'):
        NvmlDriver().read(CARD_A)


def test_gpu_lost_mid_read_names_the_card(monkeypatch):
    card = FakeCard(CARD_A)
    fake = FakeNvml(monkeypatch, [card])
    d = NvmlDriver()
    d.read(CARD_A)
    card.lost = True
    with pytest.raises(DriverError, match="lost") as e:
        d.read(CARD_A)
    assert e.value.pci == "0000:05:00.0" and "0000:05:00.0" in str(e.value)
    card.lost = False   # after a reset: the handle is taken again by bus ID
    fake.calls.clear()
    assert d.read(CARD_A).free_bytes == 20 * GiB
    assert ("by_bus", "0000:05:00.0") in fake.calls


def test_v1_only_driver_and_old_process_getters(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeCard(CARD_A, free=5 * GiB, compute=[(9, GiB)])],
                    v2=False, getters=("",))
    d = NvmlDriver()
    r = d.read(CARD_A)
    assert r.free_bytes == 5 * GiB and r.processes == {9: GiB}
    assert ("memory", "v1") in fake.calls and ("processes", "Compute") in fake.calls
    fake.calls.clear()
    d.read(CARD_A)   # the fallbacks are remembered
    assert [c for c in fake.calls if c[0] == "memory"] == [("memory", "v1")]


def test_binding_without_version_kwarg_warns_and_reads_v1(monkeypatch, caplog):
    FakeNvml(monkeypatch, [FakeCard(CARD_A, free=6 * GiB)])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo",
                        lambda h: SimpleNamespace(total=h.total, free=h.free))
    with caplog.at_level(logging.WARNING, logger="berth.driver.nvml"):
        d = NvmlDriver()
    assert "version" in caplog.text
    assert d.read(CARD_A).free_bytes == 6 * GiB


def test_mig_enabled_card_is_refused_clearly(monkeypatch):
    FakeNvml(monkeypatch, [FakeCard(CARD_A, mig=[1, 1])])
    d = NvmlDriver()
    for call in (d.cards, lambda: d.read(CARD_A)):
        with pytest.raises(DriverError, match="MIG instances are not supported yet") as e:
            call()
        assert e.value.pci == "0000:05:00.0" and "0000:05:00.0" in str(e.value)
    FakeNvml(monkeypatch, [FakeCard(CARD_A, mig=[0, 0])])
    assert NvmlDriver().read(CARD_A).pci == "0000:05:00.0"


def test_close_shuts_down_once(monkeypatch):
    fake = FakeNvml(monkeypatch, [])
    d = NvmlDriver()
    d.close()
    d.close()
    assert fake.calls.count(("shutdown", None)) == 1


# ---- PID namespaces ------------------------------------------------------------------------------

def _proc(root, name: str, nspid: list[int] | None, ns: str | None = None):
    d = root / name
    (d / "ns").mkdir(parents=True)
    lines = ["Name:\tpython3", "State:\tS (sleeping)"]
    if nspid is not None:
        lines.append("NSpid:\t" + "\t".join(map(str, nspid)))
    (d / "status").write_text("\n".join(lines) + "\n")
    if ns is not None:
        (d / "ns" / "pid").symlink_to(ns)   # dangling, like the real magic link's text


def test_map_host_pids_inside_a_namespace(tmp_path):
    root = tmp_path / "proc"
    _proc(root, "self", [5000, 12], "pid:[111]")   # berthd: host 5000, ours 12
    _proc(root, "5001", [5001, 40], "pid:[111]")    # an engine in our namespace
    _proc(root, "5002", [5002, 41], "pid:[222]")    # a sibling container's process
    _proc(root, "5003", [5003], "pid:[100]")        # a host process, invisible to us
    _proc(root, "5004", [5004, 50, 7], "pid:[333]")  # nested below ours: our pid is 50
    _proc(root, "5006", None)                        # a kernel without NSpid
    got = map_host_pids([5001, 5002, 5003, 5004, 5005, 5006], root)
    assert got == {5001: 40, 5004: 50}


def test_map_host_pids_in_the_procfs_namespace_is_the_identity(tmp_path):
    root = tmp_path / "proc"
    _proc(root, "self", [812], "pid:[100]")
    assert map_host_pids([812, 9], root) == {812: 812, 9: 9}
    assert map_host_pids([3], tmp_path / "no-proc") == {3: 3}   # no NSpid: nothing to map


def test_driver_reports_pids_in_our_namespace(monkeypatch, tmp_path):
    root = tmp_path / "proc"
    _proc(root, "self", [5000, 12], "pid:[111]")
    _proc(root, "5001", [5001, 40], "pid:[111]")
    FakeNvml(monkeypatch, [FakeCard(CARD_A, compute=[(5001, GiB), (6000, 2 * GiB)])])
    r = NvmlDriver(proc_root=root).read(CARD_A)
    assert r.processes == {40: GiB}
