"""Run by ``test_aimdo_matrix.py`` in a subprocess whose ``sys.path`` starts with one real
comfy-aimdo release from PyPI: start comfy-aimdo as ComfyUI's ``main.py`` does, then let the
node keep dynamic VRAM's budget inside a lease, and print (JSON) every call into the native
library, split into ComfyUI's startup and the node's.

The native library is the release's own ``aimdo.so`` (it loads without a GPU), wrapped so every
call is recorded; the calls that need CUDA (``plat_init``, ``init``, ``get_devctx`` and the
other device calls) are answered by the wrapper instead. Arguments: ``--reserve-vram GB``
(ComfyUI's flag, default none).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import sys
import types

GiB = 1 << 30
TOTAL = 24 * GiB
#: Native calls that need a CUDA device: answered here, recorded, never run.
NEEDS_CUDA = {"plat_init": True, "init": True, "get_devctx": 1, "cleanup": None,
              "plat_cleanup": None, "aimdo_analyze": None, "get_total_vram_usage": 0}

calls: list[list] = []


def _plain(a):
    """A native call's argument as JSON: a ctypes number's value, an array's items."""
    if isinstance(a, ctypes.Array):
        return [_plain(x) for x in a]
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a
    v = getattr(a, "value", None)
    return v if isinstance(v, (bool, int, float)) else repr(type(a).__name__)


class _Fn:
    def __init__(self, name: str, fn):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)

    def __setattr__(self, key, value):          # argtypes, restype: onto the real function
        setattr(self._fn, key, value)

    def __getattr__(self, key):
        return getattr(self._fn, key)

    def __call__(self, *args):
        calls.append([self._name, [_plain(a) for a in args]])
        if self._name in NEEDS_CUDA:
            return NEEDS_CUDA[self._name]
        return self._fn(*args)


class Recorded:
    """The release's native library; a symbol it lacks raises AttributeError, as ctypes does."""

    def __init__(self, lib):
        object.__setattr__(self, "_lib", lib)
        object.__setattr__(self, "_fns", {})

    def __getattr__(self, name):
        if name not in self._fns:
            self._fns[name] = _Fn(name, getattr(self._lib, name))
        return self._fns[name]


def comfyui_startup(control, reserve_vram: float | None) -> None:
    """comfy-aimdo as ComfyUI's main.py starts it (its version-tolerant call chain)."""
    headroom = None if reserve_vram is None else int(reserve_vram * GiB)
    try:
        control.init(simple_vram_headroom=headroom, nvml_pressure=True)
    except TypeError:
        try:
            control.init(simple_vram_headroom=headroom)
        except TypeError:
            control.init()
    try:
        control.init_devices([(0, 0)])
    except TypeError:
        control.init_devices([0])


def comfyui_modules(reserve_vram: float | None) -> None:
    comfy = types.ModuleType("comfy")
    comfy.__path__ = []
    mem = types.ModuleType("comfy.memory_management")
    mem.aimdo_enabled = True
    mm = types.ModuleType("comfy.model_management")
    mm.get_torch_device = lambda: "cuda:0"
    mm.get_total_memory = lambda dev=None, torch_total_too=False: TOTAL
    cli = types.ModuleType("comfy.cli_args")
    cli.args = argparse.Namespace(reserve_vram=reserve_vram, vram_headroom=0.0)
    comfy.memory_management, comfy.model_management, comfy.cli_args = mem, mm, cli
    sys.modules.update({"comfy": comfy, "comfy.memory_management": mem,
                        "comfy.model_management": mm, "comfy.cli_args": cli})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reserve-vram", type=float, default=None)
    opts = ap.parse_args()
    real = ctypes.CDLL
    ctypes.CDLL = lambda path, mode=0, *a, **k: Recorded(real(path, mode, *a, **k))
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda rec: warned.append(rec.getMessage())
    logging.getLogger("berth.comfyui").addHandler(handler)

    import comfy_aimdo.control as control
    comfyui_startup(control, opts.reserve_vram)
    startup, calls[:] = list(calls), []
    comfyui_modules(opts.reserve_vram)
    from berth_hosts.comfyui.reservation import Reservation

    class Node(Reservation):
        args = sys.modules["comfy.cli_args"].args
        headroom_bytes = None

    node = Node()
    for _ in range(10):                 # a prompt's wait: the reservation read every 0.1 s
        node._budget(1 * GiB)
    node._budget(11 * GiB)              # the extension granted
    node._budget(0)                     # parked
    hr = getattr(node, "_headroom", None)
    native = None
    if hasattr(control, "get_simple_vram_headroom"):
        native = control.get_simple_vram_headroom()
    print(json.dumps({"startup": startup, "node": calls, "how": getattr(hr, "how", None),
                      "headroom_bytes": node.headroom_bytes, "warnings": warned,
                      "native_headroom": native}))


if __name__ == "__main__":
    main()
