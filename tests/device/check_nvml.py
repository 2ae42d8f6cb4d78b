"""Device check: the NVML driver against a real NVIDIA card.

Runs only where an NVIDIA driver answers; elsewhere it skips with the reason (the one allowed
skip). Not collected by the default run (the file name does not match ``test_*.py``); run it with
``python -m pytest tests/device/check_nvml.py`` or directly as ``python tests/device/check_nvml.py``.

It starts a process that allocates 8 GiB on the card with the most free memory (torch when it is
installed, else the CUDA driver API through ctypes), checks that :class:`NvmlDriver` sees the card
(PCI, total) and the 8 GiB (per process, or as a drop in free bytes where per-process use or the
PID is not visible), kills the process and prints how many milliseconds passed before
:func:`berth.driver.confirm` saw the memory free.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

from berth.decide.model import normalize_pci
from berth.driver import BytesBack, DriverError, PidsGone, confirm
from berth.driver.nvml import NvmlDriver

GiB = 1 << 30
ALLOC_BYTES = 8 * GiB

_TORCH = """
import sys, torch
x = torch.empty({n}, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""

_CTYPES = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc:
        sys.exit(f"{{what}}: CUDA error {{rc}}")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
check(cuda.cuInit(0), "cuInit")
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({n})), "cuMemAlloc")
print("ready", flush=True)
sys.stdin.read()
"""


class NoGpu(Exception):
    """No NVIDIA driver answers here."""


def _allocator(uuid: str) -> tuple[subprocess.Popen, str]:
    if importlib.util.find_spec("torch") is not None:
        code, how = _TORCH.format(n=ALLOC_BYTES), "torch"
    else:
        code, how = _CTYPES.format(n=ALLOC_BYTES), "ctypes libcuda"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, how


def run_check() -> dict:
    """Returns the figures; raises :class:`NoGpu` without a driver, AssertionError on a failure."""
    try:
        driver = NvmlDriver()
        cards = driver.cards()
    except DriverError as e:
        raise NoGpu(str(e)) from None
    if not cards:
        raise NoGpu("NVML answers but lists no card")
    card = max(cards, key=lambda c: c.free_bytes)
    assert card.pci == normalize_pci(card.pci) and card.total_bytes > 0
    assert card.free_bytes >= ALLOC_BYTES + GiB, f"card {card.pci} has only {card.free_bytes} free"
    before = driver.read(card.pci)
    assert before.total_bytes == card.total_bytes

    proc, how = _allocator(card.uuid)
    try:
        line = proc.stdout.readline().strip()
        assert line == "ready", f"the {how} allocator failed (exit {proc.poll()})"
        held = driver.read(card.pci)
        per_process = held.processes.get(proc.pid) if held.processes_known else None
        if per_process is not None:
            seen = "per process"
            assert per_process >= ALLOC_BYTES, held.processes
        else:
            seen = "as a drop in free bytes"
            assert before.free_bytes - held.free_bytes >= ALLOC_BYTES, (before, held)
    finally:
        proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    if proc.pid in held.processes:
        event = PidsGone(frozenset({proc.pid}), expect_bytes=ALLOC_BYTES,
                         free_before=held.free_bytes)
    else:   # the PID is not visible here (another PID namespace): wait for the bytes instead
        event = BytesBack(n_bytes=ALLOC_BYTES, free_before=held.free_bytes)
    freed = asyncio.run(confirm(driver, card.pci, event, deadline=killed_at + 30,
                                event_at=killed_at))
    proc.wait(timeout=10)
    driver.close()
    assert freed is not None, "the killed process's memory did not go free within 30 s"
    return {"card": card.pci, "model": card.model, "total_bytes": card.total_bytes,
            "allocator": how, "seen": seen, "pid_visible": proc.pid in held.processes,
            "free_after_kill_ms": round((freed.at - killed_at) * 1000, 1)}


def test_nvml_sees_an_allocation_and_its_free():
    import pytest
    try:
        figures = run_check()
    except NoGpu as e:
        pytest.skip(f"no NVIDIA GPU here: {e}")
    print(json.dumps(figures))


if __name__ == "__main__":
    try:
        print(json.dumps(run_check(), indent=2))
    except NoGpu as e:
        print(f"SKIP: no NVIDIA GPU here: {e}")
