"""Whether an engine's own command pins its card, so that Berth must never move it.

Source: issue 35 ("an engine whose own arguments pin a card is never moved, and ``berth status``
says why"). ``berth run`` starts the engine with ``CUDA_VISIBLE_DEVICES`` naming the card of its
grant; an engine started on another card by its own arguments would not follow a move, so the
run tells berthd (the lease request's ``pinned``) and berthd moves it never.

What pins a card, looked for in the command (after ``{port}`` stays as it is):

- ``CUDA_VISIBLE_DEVICES=...`` (or ``NVIDIA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``) as an
  ``env`` assignment or a shell word;
- a device option of the common engines: llama.cpp's ``--main-gpu``/``-mg``, ``--device``/
  ``-dev``, ``--tensor-split``/``-ts``; SGLang's ``--base-gpu-id``; a ``--gpu-id``,
  ``--gpu``, ``--gpus``, ``--device-id``, ``--devices``, ``--cuda-device`` of others; a
  ``--device cuda:N`` / ``--device=cuda:N``;
- the adapter's own device option, ``--option device=...`` (or ``gpu=``, ``main_gpu=``).

A ``--device cpu`` or ``--device cuda`` (no index) pins nothing.
"""

from __future__ import annotations

import re

__all__ = ["pinned"]

_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES")
_FLAGS = ("--main-gpu", "-mg", "--tensor-split", "-ts", "--base-gpu-id", "--gpu-id", "--gpu",
          "--gpus", "--device-id", "--devices", "--cuda-device", "--device", "-dev")
_OPTIONS = ("device", "gpu", "main_gpu", "gpu_id")
#: A device value that names no card: the default device, or none.
_NO_CARD = re.compile(r"^(cpu|cuda|auto|none|gpu)$", re.I)


def _names_a_card(value: str) -> bool:
    return bool(value) and not _NO_CARD.match(value.strip())


def pinned(cmd: list[str], options: dict[str, str] | None = None) -> str | None:
    """Why the engine's command ``cmd`` (or its adapter ``options``) pins its card, in words
    naming what pins it, or ``None`` when Berth may move it."""
    for i, word in enumerate(cmd):
        name, eq, value = word.partition("=")
        if eq and name in _ENV:
            return f"its command sets {word} (Berth sets the card with CUDA_VISIBLE_DEVICES)"
        if name in _FLAGS:
            given = value if eq else (cmd[i + 1] if i + 1 < len(cmd) else "")
            if _names_a_card(given):
                return f"its command names a card ({name} {given})"
    for key, value in (options or {}).items():
        if key in _OPTIONS and _names_a_card(value):
            return f"its adapter's option {key}={value} names a card"
    return None
