"""The node against the comfy-aimdo releases ComfyUI ships (issue 28), each installed from PyPI
and started as ComfyUI's ``main.py`` starts it (``aimdo_probe.py``, in a subprocess per
release; the native library's CUDA calls answered by a recorder).

What each release's ``control.py`` offers to change the simple VRAM headroom (the value of
ComfyUI's ``--reserve-vram``) while ComfyUI runs, and so what the node must use:

- 0.4.9 (ComfyUI 0.24.0's, Comfy-Org/ComfyUI #14447): nothing; ``init`` takes no headroom;
- 0.4.10: ``init(simple_vram_headroom=)`` and the native ``set_simple_vram_headroom``;
- 0.4.11 to 0.5.2: the same, but ``init`` on a loaded library also sets NVML pressure, to off
  unless told (the pressure that makes ComfyUI back off when other programs use the card);
- 0.5.3 and later (0.5.5: a recent ComfyUI's pin; 0.6.0: the newest):
  ``control.set_simple_vram_headroom``.

Each release is installed once (``pip install --target``) into pytest's cache directory and
kept there for later sessions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GiB = 1 << 30
PROBE = Path(__file__).with_name("aimdo_probe.py")
ROOT = Path(__file__).resolve().parents[3]

#: Release -> the route the node must take (None: the release offers none).
ROUTES = {
    "0.4.9": None,
    "0.4.10": "lib.set_simple_vram_headroom",
    "0.4.11": "lib.set_simple_vram_headroom",
    "0.4.15": "lib.set_simple_vram_headroom",
    "0.5.0": "lib.set_simple_vram_headroom",
    "0.5.2": "lib.set_simple_vram_headroom",
    "0.5.3": "control.set_simple_vram_headroom",
    "0.5.5": "control.set_simple_vram_headroom",
    "0.6.0": "control.set_simple_vram_headroom",
}
NVML = {v for v in ROUTES if v not in ("0.4.9", "0.4.10")}       # releases with NVML pressure


def _install(cache: Path, version: str) -> Path:
    """comfy-aimdo ``version`` in a folder of its own under ``cache`` (installed once; a
    concurrent session's copy wins the rename)."""
    dest = cache / version
    if (dest / "comfy_aimdo" / "control.py").exists():
        return dest
    tmp = cache / f".{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--target", str(tmp),
                        f"comfy-aimdo=={version}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"pip install comfy-aimdo=={version} failed:\n{r.stderr}"
    try:
        tmp.rename(dest)
    except OSError:                                 # another session installed it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


@pytest.fixture(scope="session")
def aimdo(request):
    cache = request.config.cache.mkdir("comfy-aimdo")

    def run(version: str, *args: str) -> dict:
        where = _install(cache, version)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
        r = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True,
                           env=env, timeout=60, cwd=str(ROOT))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])
    return run


def _sets(calls: list) -> list[int]:
    return [args[0] for name, args in calls if name == "set_simple_vram_headroom"]


@pytest.mark.parametrize("version", list(ROUTES))
def test_the_node_sets_what_each_release_offers_and_keeps_nvml_pressure(aimdo, version):
    out = aimdo(version)
    node = out["node"]
    # Never comfy-aimdo's init again, so never NVML pressure.
    assert not [c for c in node if c[0] in ("set_nvml_pressure", "init")], node
    if version in NVML:
        pressure = [a[0] for n, a in out["startup"] if n == "set_nvml_pressure"]
        assert pressure and pressure[-1] is True, out["startup"]   # ComfyUI's own, kept on
    if ROUTES[version] is None:
        assert node == [] and out["headroom_bytes"] is None
        # Said once, not at every read of the reservation while a prompt waits.
        assert len(out["warnings"]) == 1 and "offers no way" in out["warnings"][0], out
        assert out["how"] is None
        return
    assert out["how"] == ROUTES[version], out
    # The card's total less the reservation: 1 GiB reserved, 11 GiB once extended, parked.
    assert _sets(node) == [23 * GiB, 13 * GiB, 24 * GiB], node
    assert out["headroom_bytes"] == 24 * GiB and out["warnings"] == []
    if out["native_headroom"] is not None:                 # the release's own library says
        assert out["native_headroom"] == 24 * GiB


@pytest.mark.parametrize("version", ["0.4.11", "0.6.0"])
def test_the_node_never_sets_less_than_reserve_vram(aimdo, version):
    out = aimdo(version, "--reserve-vram", "23.5")
    assert _sets(out["startup"]) == [int(23.5 * GiB)]        # ComfyUI's main.py
    assert _sets(out["node"]) == [int(23.5 * GiB), 24 * GiB], out["node"]
