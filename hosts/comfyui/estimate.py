"""How much card memory a prompt will ask for, before it runs: the model files its loader nodes
name (their sizes on disk) plus an allowance.

Source: issue 13 "Growth that asks first"; seed 000 "Admission bounds" (growth allowance);
ComfyUI's ``nodes.py`` loader nodes and ``folder_paths.get_full_path`` (0.3.64).

A model's weights take about their file's size on the card (safetensors hold the tensors as they
are loaded); activations, the VAE's decode and the allocator's cache come on top, which is what
the allowance covers. Loader nodes this table lacks (custom ones) are still counted when an
input is a file name with a model extension found in one of the model folders.
"""

from __future__ import annotations

import os
from typing import Callable

__all__ = ["LOADERS", "MODEL_EXTENSIONS", "model_files", "need_bytes"]

#: Loader nodes and the inputs that name a model file, with the folder each is looked up in.
LOADERS: dict[str, dict[str, str]] = {
    "CheckpointLoaderSimple": {"ckpt_name": "checkpoints"},
    "CheckpointLoader": {"ckpt_name": "checkpoints"},
    "unCLIPCheckpointLoader": {"ckpt_name": "checkpoints"},
    "ImageOnlyCheckpointLoader": {"ckpt_name": "checkpoints"},
    "UNETLoader": {"unet_name": "diffusion_models"},
    "CLIPLoader": {"clip_name": "text_encoders"},
    "DualCLIPLoader": {"clip_name1": "text_encoders", "clip_name2": "text_encoders"},
    "TripleCLIPLoader": {"clip_name1": "text_encoders", "clip_name2": "text_encoders",
                         "clip_name3": "text_encoders"},
    "VAELoader": {"vae_name": "vae"},
    "LoraLoader": {"lora_name": "loras"},
    "LoraLoaderModelOnly": {"lora_name": "loras"},
    "ControlNetLoader": {"control_net_name": "controlnet"},
    "CLIPVisionLoader": {"clip_name": "clip_vision"},
    "StyleModelLoader": {"style_model_name": "style_models"},
    "UpscaleModelLoader": {"model_name": "upscale_models"},
}

#: File endings of model files (ComfyUI's ``supported_pt_extensions`` plus GGUF).
MODEL_EXTENSIONS = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf", ".pt2")

#: Folders searched for a model file named by a node the table does not know.
_ANY_FOLDER = ("checkpoints", "diffusion_models", "unet", "text_encoders", "clip", "vae", "loras",
               "controlnet", "clip_vision", "style_models", "upscale_models", "gligen",
               "hypernetworks", "photomaker", "model_patches")

Resolve = Callable[[str, str], "str | None"]


def model_files(prompt: object, resolve: Resolve) -> list[str]:
    """Paths of the model files ``prompt`` (ComfyUI's API format: ``{node_id: {"class_type",
    "inputs"}}``) names, each once, in node order. ``resolve(folder, name)`` is ComfyUI's
    ``folder_paths.get_full_path``. Names that resolve nowhere are skipped: ComfyUI refuses
    such a prompt at validation, before it could load anything."""
    if not isinstance(prompt, dict):
        return []
    out: dict[str, None] = {}
    for node in prompt.values():
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            continue
        inputs = node["inputs"]
        known = LOADERS.get(str(node.get("class_type")))
        if known is not None:
            pairs = [(folder, inputs.get(name)) for name, folder in known.items()]
        else:
            pairs = [(None, v) for v in inputs.values()
                     if isinstance(v, str) and v.lower().endswith(MODEL_EXTENSIONS)]
        for folder, name in pairs:
            if not isinstance(name, str):
                continue
            for f in (folder,) if folder else _ANY_FOLDER:
                try:
                    path = resolve(f, name)
                except Exception:          # an unknown folder name raises in ComfyUI
                    path = None
                if path:
                    out[path] = None
                    break
    return list(out)


def need_bytes(prompt: object, resolve: Resolve, allowance_bytes: int) -> tuple[int, list[str]]:
    """``(bytes, files)``: the sizes on disk of the model files ``prompt`` names plus
    ``allowance_bytes``, and those files. A prompt that names no model file needs nothing more
    than what ComfyUI already holds: ``(0, [])``."""
    files = model_files(prompt, resolve)
    if not files:
        return 0, []
    total = 0
    for path in files:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total + allowance_bytes, files
