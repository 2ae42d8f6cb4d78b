"""The ComfyUI objects the node touches, reached by ComfyUI's own names.

Source: reference/hosts.md "ComfyUI" (startup order, routes and middleware, threads, flags that
defeat unloading); ComfyUI ``server.py`` (``PromptServer.instance``), ``execution.py``
(``PromptQueue.set_flag/get_flags/get_tasks_remaining``), ``comfy/cli_args.py``,
``folder_paths.py``; dynamic VRAM: Comfy-Org/ComfyUI #14396 and PR #14480 (``--vram-headroom``,
a dynamic ``--reserve-vram``), comfy-aimdo ``control.init(simple_vram_headroom=N)`` and, in newer
releases, ``control.set_simple_vram_headroom(N)``: bytes the dynamic loader leaves free on the
card, settable at any time.

Every function tolerates a ComfyUI that lacks the object (an older or newer release, the
stand-in): it returns ``None``/``False`` and the node does without.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["prompt_server", "cli_args", "unloading_defeated", "resolver", "aimdo_control",
           "set_headroom", "card_total_bytes", "loaded_models"]

log = logging.getLogger("berth.comfyui")


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


def set_headroom(control: Any, headroom_bytes: int) -> bool:
    """Keep ``headroom_bytes`` of the card free of ComfyUI's dynamic loader. True when set."""
    n = max(0, int(headroom_bytes))
    try:
        if hasattr(control, "set_simple_vram_headroom"):
            control.set_simple_vram_headroom(n)
        else:
            control.init(simple_vram_headroom=n)
        return True
    except Exception as e:
        log.warning("Berth: could not set the dynamic VRAM headroom to %d bytes: %s", n, e)
        return False


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
