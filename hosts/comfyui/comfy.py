"""The ComfyUI objects the node touches, reached by ComfyUI's own names.

Source: reference/hosts.md "ComfyUI" (startup order, routes and middleware, threads, flags that
defeat unloading); ComfyUI ``server.py`` (``PromptServer.instance``), ``execution.py``
(``PromptQueue.set_flag/get_flags/get_tasks_remaining``), ``comfy/cli_args.py``,
``folder_paths.py``; dynamic VRAM: ComfyUI's ``main.py`` (since 0.24) calls comfy-aimdo's
``control.init(simple_vram_headroom=<--reserve-vram in bytes>, nvml_pressure=not
--disable-nvml-pressure)`` and ``control.init_devices((index, <--vram-headroom in bytes>))``:
the process-wide simple headroom (bytes the dynamic loader leaves free on the card) is
``--reserve-vram``'s, and it is the one value that can change while ComfyUI runs
(:class:`Headroom`); ``--vram-headroom`` is a per-card extra fixed at start.

Every function tolerates a ComfyUI that lacks the object (an older or newer release, the
stand-in): it returns ``None``/``False`` and the node does without.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

__all__ = ["prompt_server", "cli_args", "unloading_defeated", "resolver", "aimdo_control",
           "reserve_vram_bytes", "Headroom", "card_total_bytes", "loaded_models"]

log = logging.getLogger("berth.comfyui")

_GiB = 1 << 30


def prompt_server() -> Any | None:
    """``server.PromptServer.instance``, or None outside ComfyUI (the module is ComfyUI's
    ``server.py``, importable once ComfyUI's ``main.py`` runs)."""
    mod = sys.modules.get("server")
    return getattr(getattr(mod, "PromptServer", None), "instance", None) if mod else None


def cli_args() -> Any | None:
    try:
        from comfy.cli_args import args  # ComfyUI's parsed command line
        return args
    except Exception:
        return None


def unloading_defeated(args: Any | None) -> str | None:
    """The flag under which unloading frees nothing (``--highvram`` makes the GPU the UNet's
    offload device, ``--gpu-only`` every model's; reference "Flags that defeat unloading"),
    or None."""
    if args is None:
        return None
    if getattr(args, "gpu_only", False):
        return "--gpu-only"
    if getattr(args, "highvram", False):
        return "--highvram"
    return None


def resolver():
    """``folder_paths.get_full_path(folder, name)``, or a function that finds nothing."""
    try:
        import folder_paths
        return folder_paths.get_full_path
    except Exception:
        return lambda folder, name: None


def aimdo_control() -> Any | None:
    """comfy-aimdo's ``control`` module when dynamic VRAM is on (``comfy.memory_management.
    aimdo_enabled`` and the library loaded), else None (``--disable-dynamic-vram``, releases
    before it, the CPU)."""
    try:
        import comfy.memory_management as mm
        if not getattr(mm, "aimdo_enabled", False):
            return None
        import comfy_aimdo.control as control
        return control if getattr(control, "lib", None) is not None else None
    except Exception:
        return None


def reserve_vram_bytes(args: Any | None) -> int:
    """The user's ``--reserve-vram`` (GB) in bytes, 0 when not given. ComfyUI's ``main.py``
    hands it to comfy-aimdo as ``simple_vram_headroom``: the node never sets less."""
    gb = getattr(args, "reserve_vram", None) if args is not None else None
    try:
        return max(0, int(float(gb) * _GiB)) if gb is not None else 0
    except (TypeError, ValueError):
        return 0


class Headroom:
    """How the comfy-aimdo release ComfyUI loaded lets the simple VRAM headroom change while it
    runs, found once from ``control`` (each release's ``control.py`` read, 0.4.9 to 0.6.0):

    - 0.5.3 and later: ``control.set_simple_vram_headroom(n)``;
    - 0.4.10 to 0.5.0: the native ``lib.set_simple_vram_headroom`` (its ``argtypes`` set by
      ``init``). Never ``control.init(simple_vram_headroom=n)`` again: from 0.4.11 to 0.5.0 it
      also sets NVML pressure to its default, off, and NVML pressure is what makes ComfyUI
      back off when other programs use the card;
    - 0.4.9 (ComfyUI 0.24.0's): no way at all; ``how`` is None and ``why`` says so, once.

    ``how`` names the route taken. Sizes in bytes.
    """

    def __init__(self, control: Any):
        self.control = control
        self.version = _aimdo_version()
        self.how: str | None = None
        self.why = ""
        self._failed: str | None = None
        lib = getattr(control, "lib", None)
        if callable(getattr(control, "set_simple_vram_headroom", None)):
            self.how = "control.set_simple_vram_headroom"
        elif lib is not None and _has(lib, "set_simple_vram_headroom"):
            self.how = "lib.set_simple_vram_headroom"
        else:
            self.why = (f"comfy-aimdo {self.version} offers no way to change the VRAM headroom "
                        f"while ComfyUI runs (0.4.10 and later do): ComfyUI's dynamic VRAM is "
                        f"not kept inside its lease; berthd still sees its use")
            log.warning("Berth: %s", self.why)

    def set(self, headroom_bytes: int) -> bool:
        """Keep ``headroom_bytes`` of the card free of ComfyUI's dynamic loader. True when set;
        a failure is logged once per distinct error."""
        if self.how is None:
            return False
        n = max(0, int(headroom_bytes))
        try:
            if self.how == "control.set_simple_vram_headroom":
                self.control.set_simple_vram_headroom(n)
            else:
                self.control.lib.set_simple_vram_headroom(ctypes.c_int64(n))
            return True
        except Exception as e:
            if self._failed != repr(e):
                self._failed = repr(e)
                log.warning("Berth: could not set the dynamic VRAM headroom to %d bytes through "
                            "%s (comfy-aimdo %s): %s", n, self.how, self.version, e)
            return False


def _has(lib: Any, name: str) -> bool:
    try:
        return getattr(lib, name, None) is not None     # a CDLL raises for a missing symbol
    except Exception:
        return False


def _aimdo_version() -> str:
    try:
        from importlib.metadata import version
        return version("comfy-aimdo")
    except Exception:
        return "(version unknown)"


def card_total_bytes() -> int | None:
    """The card's total memory as ComfyUI's model management reads it, or None."""
    try:
        import comfy.model_management as mm
        return int(mm.get_total_memory(mm.get_torch_device()))
    except Exception:
        return None


def loaded_models() -> int | None:
    """How many models ComfyUI holds loaded (``current_loaded_models``), or None."""
    try:
        import comfy.model_management as mm
        return len(mm.current_loaded_models)
    except Exception:
        return None
