"""The NVML driver (``[driver] kind = "nvml"``), through nvidia-ml-py's ``pynvml`` module.

Source: reference/park-mechanisms.md "NVML for the driver read" and "Which package provides
``pynvml``"; seed 002 rule 1 ("the driver decides").

What it does, and why:

- **Cards by PCI bus ID.** Discovery walks NVML's indices once; from then on every handle is taken
  with ``nvmlDeviceGetHandleByPciBusId`` (NVML order is not CUDA order, and indices move). Bus IDs
  in either spelling (``00000000:05:00.0``, ``0000:05:00.0``, ``bytes`` from old bindings) are
  normalised with :func:`berth.decide.model.normalize_pci`.
- **Memory: free is the ground truth.** ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)``
  where the driver has it (v1 counts reserved memory as used), else v1.
- **Processes.** Compute and graphics lists (v3 getters, falling back to v2 and v1). A process's
  ``usedGpuMemory`` that is ``None`` (WDDM), ``NVML_VALUE_NOT_AVAILABLE`` or 0 (some containers,
  HAMi-core#112: a listed process always holds at least its context) is reported as ``None``,
  never 0. A card whose process list is ``NOT_SUPPORTED`` gives ``processes_known=False``.
- **PIDs.** NVML reports host PIDs; :func:`map_host_pids` turns them into Berth's own.
- **MIG.** A card with MIG mode enabled is refused with a :class:`DriverError` (parent handles give
  aggregates only; MIG instances are not supported yet).
- **Errors.** No driver or library → a :class:`DriverError` that names the ``sim`` driver; a card
  lost mid-read (``GPU_IS_LOST``) → a :class:`DriverError` carrying its PCI.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from berth.decide.model import normalize_pci
from berth.driver.base import CardInfo, Driver, DriverError, Reading

__all__ = ["NvmlDriver", "map_host_pids", "NO_DRIVER_HINT"]

log = logging.getLogger(__name__)

# `berth sim init` alone is no way out: berthd reads its cards from berth.toml, and
# kind = "sim" without [[driver.cards]] is refused, so the hint names both and the example.
NO_DRIVER_HINT = ('To run Berth without an NVIDIA GPU, use the simulated cards: set '
                  '`[driver] kind = "sim"` in berth.toml (BERTH_CONFIG) and declare each card '
                  'as a [[driver.cards]] entry (name, total), as core/examples/berth.toml '
                  'does; `berth demo` runs the main job on a simulated card with no config.')

# NVML return codes (nvml.h); read from the module when it has them.
_UNINITIALIZED, _NOT_SUPPORTED, _NOT_FOUND, _DRIVER_NOT_LOADED = 1, 3, 6, 9
_LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND, _GPU_IS_LOST, _ARGUMENT_VERSION_MISMATCH = 12, 13, 15, 25
_NO_DRIVER = frozenset({_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND})
_MIG_ENABLE = 1
# ``usedGpuMemory`` sentinels: NVML_VALUE_NOT_AVAILABLE as unsigned long long, and as -1.
_NOT_AVAILABLE = frozenset({(1 << 64) - 1, -1})


def _nspid(status: Path) -> list[int] | None:
    """The ``NSpid:`` line of a ``/proc/<pid>/status`` file, or ``None``."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        return None
    return None


def _ns_link(proc_dir: Path) -> str | None:
    try:
        return os.readlink(proc_dir / "ns" / "pid")
    except OSError:   # gone, or another user's process (ptrace access needed)
        return None


def map_host_pids(host_pids: Iterable[int], proc_root: str | os.PathLike[str] = "/proc"
                  ) -> dict[int, int]:
    """Map NVML's host PIDs to PIDs in Berth's own PID namespace. Returns ``{host: ours}``;
    a host PID with no PID in our namespace is left out.

    ``/proc/<pid>/status`` has an ``NSpid:`` line (Linux ≥ 4.1): the PID of that process in every
    PID namespace it belongs to, **leftmost in the namespace of the procfs instance being read**
    (the one that mounted it), then each nested namespace inward; the last field is the PID in the
    process's own innermost namespace. The directory name is the leftmost field.

    1. Read ``<proc_root>/self/status``. One field: we share the procfs's namespace, so its PIDs
       are ours and the map is the identity. (A container that mounted its own ``/proc`` also lands
       here and cannot see host PIDs at all: run berthd in the host PID namespace, or bind the
       host's ``/proc`` and pass it as ``proc_root``; nvidia-docker#1483.)
    2. Otherwise we sit ``d = len(fields) − 1`` namespaces below the procfs's, which must be the
       host's (``unshare --pid`` without a new ``/proc``, or the host's ``/proc`` bound in). For each
       host PID, ``<proc_root>/<host pid>/status`` gives its ``NSpid``; its PID in our namespace is
       field ``d``. A process with fewer fields is outside our namespace; one with exactly ``d + 1``
       fields must be in our very namespace (same ``ns/pid`` link), not a sibling's.
    """
    root = Path(proc_root)
    pids = list(host_pids)
    own = _nspid(root / "self" / "status")
    if own is None or len(own) <= 1:
        return {p: p for p in pids}   # (1)
    depth = len(own) - 1               # (2)
    own_ns = _ns_link(root / "self")
    out: dict[int, int] = {}
    for host in pids:
        ns = _nspid(root / str(host) / "status")
        if ns is None or ns[0] != host or len(ns) <= depth:
            continue
        if len(ns) == depth + 1 and own_ns is not None:
            link = _ns_link(root / str(host))
            if link is not None and link != own_ns:
                continue
        out[host] = ns[depth]
    return out


def _text(v: Any) -> str:
    return v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)


def _used_bytes(v: Any) -> int | None:
    """``usedGpuMemory`` as bytes, or ``None`` when NVML cannot say (never 0)."""
    if v is None:
        return None
    v = int(v)
    if v in _NOT_AVAILABLE or v <= 0 or v >= 1 << 63:
        return None
    return v


class NvmlDriver(Driver):
    """Reads NVIDIA cards through NVML. ``nvmlInit`` runs once, here; :meth:`close` shuts down.

    ``proc_root`` is the procfs used for PID namespace mapping (:func:`map_host_pids`);
    ``nvml`` replaces the ``pynvml`` module (tests). Raises :class:`DriverError` when NVML cannot
    start (no driver, no library, nvidia-ml-py not installed), with :data:`NO_DRIVER_HINT`.
    """

    kind = "nvml"

    def __init__(self, *, proc_root: str | os.PathLike[str] = "/proc",
                 nvml: ModuleType | None = None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                raise DriverError(f"nvidia-ml-py is not installed ({e}); no NVIDIA driver can be "
                                  f"read. {NO_DRIVER_HINT}") from None
        self._nv = nvml
        self._proc_root = Path(proc_root)
        self._handles: dict[str, Any] = {}
        self._bus_ids: dict[str, str] = {}
        self._mig_checked: set[str] = set()
        self._getters: dict[str, int] = {}
        self._warned_no_list: set[str] = set()
        self._closed = False
        self._mem_v2 = self._binding_has_v2()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise self._error(e, None, "starting NVML") from None

    def _binding_has_v2(self) -> bool:
        fn = getattr(self._nv, "nvmlDeviceGetMemoryInfo", None)
        try:
            has_kw = fn is not None and "version" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            has_kw = False
        if not has_kw or not hasattr(self._nv, "nvmlMemory_v2"):
            log.warning("pynvml at %s has no nvmlDeviceGetMemoryInfo(version=...): reading v1 "
                        "memory, which counts reserved memory as used; install a current "
                        "nvidia-ml-py (and remove the deprecated 'pynvml' / 'nvidia-ml-py3' "
                        "packages that shadow it)", getattr(self._nv, "__file__", "?"))
            return False
        return True

    # ---- the Driver interface --------------------------------------------------------------------

    def cards(self) -> list[CardInfo]:
        """Every card NVML lists, in PCI order. Raises :class:`DriverError` for a MIG-enabled
        card (naming it) and for any NVML failure."""
        nv = self._nv
        out = []
        pci = None
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(index)
                raw = _text(nv.nvmlDeviceGetPciInfo(h).busId)
                try:
                    pci = normalize_pci(raw)
                except ValueError as e:
                    raise DriverError(f"NVML card {index} has an unreadable bus ID: {e}") from None
                self._bus_ids[pci] = raw
                h = self._handle(pci)
                mem = self._memory(h)
                out.append(CardInfo(pci=pci, uuid=_text(nv.nvmlDeviceGetUUID(h)),
                                    model=_text(nv.nvmlDeviceGetName(h)),
                                    total_bytes=int(mem.total), free_bytes=int(mem.free),
                                    index=index))
        except nv.NVMLError as e:
            raise self._error(e, pci, "listing cards") from None
        return sorted(out, key=lambda c: c.pci)

    def read(self, pci: str) -> Reading:
        """Free bytes and per-process use of card ``pci`` now (``at`` = ``time.monotonic()``
        when both reads are done). PIDs are in Berth's namespace. Raises :class:`DriverError`
        naming the card (lost, unknown, MIG-enabled, NVML failure)."""
        try:
            norm = normalize_pci(pci)
        except ValueError as e:
            raise DriverError(str(e), pci=str(pci)) from None
        try:
            h = self._handle(norm)
            mem = self._memory(h)
            procs, known = self._processes(norm, h)
        except self._nv.NVMLError as e:
            raise self._error(e, norm, "reading") from None
        at = time.monotonic()
        mapped = map_host_pids(procs, self._proc_root)
        return Reading(pci=norm, at=at, free_bytes=int(mem.free), total_bytes=int(mem.total),
                       processes={mapped[h_pid]: b for h_pid, b in procs.items() if h_pid in mapped},
                       processes_known=known)

    def close(self) -> None:
        """``nvmlShutdown`` once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._handles.clear()
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)

    # ---- NVML calls ------------------------------------------------------------------------------

    def _handle(self, pci: str) -> Any:
        h = self._handles.get(pci)
        if h is None:
            h = self._nv.nvmlDeviceGetHandleByPciBusId(self._bus_ids.get(pci, pci))
            self._refuse_mig(pci, h)
            self._handles[pci] = h
        return h

    def _refuse_mig(self, pci: str, h: Any) -> None:
        if pci in self._mig_checked:
            return
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetMigMode", None)
        mode = None
        if fn is not None:
            try:
                mode = fn(h)
            except nv.NVMLError as e:   # NOT_SUPPORTED on consumer cards: not MIG
                if _code(e) not in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                    raise
        if mode is not None and int(mode[0]) == _MIG_ENABLE:
            raise DriverError(
                f"card {pci} has MIG mode enabled; MIG instances are not supported yet. Disable "
                f"MIG on it (`nvidia-smi -i {pci} -mig 0`, then reset the card) or leave the card "
                f"out of Berth.", pci=pci)
        self._mig_checked.add(pci)

    def _memory(self, h: Any) -> Any:
        nv = self._nv
        if self._mem_v2:
            try:
                return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
            except TypeError:
                log.warning("pynvml's nvmlDeviceGetMemoryInfo rejects version=; reading v1 memory")
                self._mem_v2 = False
            except nv.NVMLError as e:
                if _code(e) not in (_FUNCTION_NOT_FOUND, _NOT_SUPPORTED, _ARGUMENT_VERSION_MISMATCH):
                    raise
                log.info("this NVIDIA driver has no v2 memory info (%s); reading v1", e)
                self._mem_v2 = False
        return nv.nvmlDeviceGetMemoryInfo(h)

    def _processes(self, pci: str, h: Any) -> tuple[dict[int, int | None], bool]:
        merged: dict[int, int | None] = {}
        known = True
        for kind in ("Compute", "Graphics"):
            plist = self._process_list(kind, h)
            if plist is None:
                known = False
                if pci not in self._warned_no_list:
                    self._warned_no_list.add(pci)
                    log.warning("card %s: NVML cannot list %s processes; confirming by free "
                                "bytes only", pci, kind.lower())
                continue
            for p in plist:
                pid, used = int(p.pid), _used_bytes(getattr(p, "usedGpuMemory", None))
                if pid in merged and (used is None or (merged[pid] or 0) >= used):
                    continue   # the same process in both lists reports its one total twice
                merged[pid] = used
        return merged, known

    def _process_list(self, kind: str, h: Any) -> list | None:
        """The newest getter this binding and driver have; ``None`` when none is supported."""
        nv = self._nv
        names = [f"nvmlDeviceGet{kind}RunningProcesses{v}" for v in ("_v3", "_v2", "")]
        for i in range(self._getters.get(kind, 0), len(names)):
            fn = getattr(nv, names[i], None)
            if fn is None:
                continue
            try:
                plist = fn(h)
            except nv.NVMLError as e:
                if _code(e) == _FUNCTION_NOT_FOUND:
                    continue
                if _code(e) == _NOT_SUPPORTED:
                    return None
                raise
            self._getters[kind] = i
            return list(plist)
        return None

    def _error(self, e: Exception, pci: str | None, doing: str) -> DriverError:
        code = _code(e)
        if code in _NO_DRIVER:
            return DriverError(f"no NVIDIA driver was found (NVML: {e}, while {doing}). "
                               f"{NO_DRIVER_HINT}", pci=pci)
        if code == _GPU_IS_LOST:
            if pci is not None:
                self._handles.pop(pci, None)
                self._mig_checked.discard(pci)
            return DriverError(f"card {pci} is lost (NVML: GPU is lost, while {doing}): it fell "
                               f"off the bus or needs a reset; see `nvidia-smi` and the kernel log "
                               f"(Xid 79)", pci=pci)
        if code == _NOT_FOUND and pci is not None:
            return DriverError(f"no NVIDIA card at {pci} (NVML: {e})", pci=pci)
        return DriverError(f"NVML error while {doing}" + (f" card {pci}" if pci else "")
                           + f": {e}", pci=pci)


def _code(e: Exception) -> int | None:
    return getattr(e, "value", None)
