"""What ``berth llama-swap wrap`` chooses when it is not told: the product's defaults.

Source: issue 30 ("wrap's defaults are the product"); llama-swap ``0bdb372``
(``internal/process/process_command.go``: ``cmd`` is exec'd without a shell;
``internal/server/api.go`` ``handleUpstream`` and ``internal/config/upstream.go``:
``upstream.ignorePaths``); reference/park-mechanisms.md "cuda-checkpoint".

- **The berth executable** is the absolute path of the ``berth`` that runs wrap
  (:func:`running_berth`): llama-swap runs ``cmd`` without a shell, with its own ``PATH``, on
  which a virtual environment's ``bin`` seldom is.
- **Park**: ``auto`` parks by checkpoint when ``cuda-checkpoint`` is found
  (:func:`find_checkpoint`: ``--checkpoint-path``, else ``$BERTH_CUDA_CHECKPOINT``, else
  ``PATH``), and writes its absolute path on each ``berth run`` line; otherwise models drain,
  and a note says why and how to turn parks on.
- **Reads start nothing**: llama-swap starts a model that is not running for any request to
  ``/upstream/<model>/<path>``, a read included, so a monitor that polls a drained model's
  ``/health`` there would start it every few seconds (and Berth would drain another engine for
  it). ``upstream.ignorePaths`` makes llama-swap answer 409 for those paths instead, unless the
  model is ready. wrap adds :data:`READ_PATHS` to it, keeping llama-swap's own default pattern
  (:data:`LLAMA_SWAP_DEFAULT_IGNORE`, which applies only when the key is absent) or the user's
  patterns. ``/`` is left out: llama-swap's UI loads a model through ``/upstream/<model>/``.
- **The front answers llama-swap's health check** (``berth run --front-health``): the check
  passes as soon as the run's front listens, so llama-swap hands requests over at its first poll
  (250 ms after the spawn, then only once a second) and the front holds them, with keep-alive
  bytes for streams, while the lease waits and the engine starts.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["resolve", "running_berth", "find_checkpoint", "READ_PATHS", "READ_PATTERN",
           "LLAMA_SWAP_DEFAULT_IGNORE", "ignore_reads"]

#: Paths a monitor or a UI reads from an engine (llama.cpp's server, vLLM, SGLang).
READ_PATHS = ("/health", "/v1/health", "/v1/models", "/models", "/props", "/metrics", "/slots")
#: One pattern for them (llama-swap matches the path after ``/upstream/<model>``).
READ_PATTERN = "^/(" + "|".join(p.lstrip("/") for p in READ_PATHS) + ")/?$"
#: llama-swap's own default ``ignorePaths`` (``DefaultUpstreamIgnorePathsPattern``), used by it
#: only when the config gives none.
LLAMA_SWAP_DEFAULT_IGNORE = r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$"


def running_berth() -> str:
    """The absolute path of the ``berth`` executable running now: ``sys.argv[0]`` when it is
    that script, else the ``berth`` beside this Python (a virtual environment's ``bin``), else
    the one on ``PATH``; ``"berth"`` when none is found."""
    first = sys.argv[0] if sys.argv else ""
    if os.path.basename(first) == "berth" and os.path.isfile(first):
        return os.path.abspath(first)
    beside = Path(sys.executable).parent / "berth"
    if beside.is_file():
        return str(beside.absolute())
    found = shutil.which("berth")
    return os.path.abspath(found) if found else "berth"


def find_checkpoint(path: str | None) -> str | None:
    """The absolute path of the cuda-checkpoint a park would run: ``path``, else
    ``$BERTH_CUDA_CHECKPOINT``, else ``cuda-checkpoint`` on ``PATH``; ``None`` when not found."""
    tool = path or os.environ.get("BERTH_CUDA_CHECKPOINT") or "cuda-checkpoint"
    found = shutil.which(tool)
    return os.path.abspath(found) if found else None


def ignore_reads(doc: dict) -> list[str]:
    """Add :data:`READ_PATTERN` to ``upstream.ignorePaths`` of ``doc`` in place (keeping the
    user's patterns, or llama-swap's default when there were none). Returns notes. Raises
    ``ValueError`` naming the key when ``upstream`` or its ``ignorePaths`` has the wrong type."""
    upstream = doc.get("upstream")
    if upstream is None:
        upstream = doc["upstream"] = {}
    if not isinstance(upstream, dict):
        raise ValueError(f"upstream: expected a mapping with ignorePaths, got {upstream!r}")
    paths = upstream.get("ignorePaths")
    if paths is None or paths == []:
        paths = [LLAMA_SWAP_DEFAULT_IGNORE]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ValueError(f"upstream.ignorePaths: expected a list of regular expressions, got "
                         f"{paths!r}")
    if READ_PATTERN in paths:
        upstream["ignorePaths"] = paths
        return []
    upstream["ignorePaths"] = [*paths, READ_PATTERN]
    return [f"upstream.ignorePaths: added {READ_PATTERN}: a read of a model that is not running "
            f"(GET /upstream/<model>/health and the like) gets llama-swap's 409 instead of "
            f"starting it (and Berth draining another engine for it)"]


def resolve(park: str, berth: str | None, checkpoint_path: str | None, notes: list[str],
            warnings: list[str]) -> tuple[str, str, str | None]:
    """``(park, berth, checkpoint_path)`` as wrap writes them: ``berth`` defaults to
    :func:`running_berth`; ``auto`` park becomes ``checkpoint`` when :func:`find_checkpoint`
    finds the tool (whose absolute path is returned) and ``none`` otherwise. Appends what it
    chose to ``notes`` and what may fail to ``warnings``. Raises ``ValueError`` for an unknown
    ``park``."""
    if park not in ("auto", "checkpoint", "none"):
        raise ValueError(f"--park: expected auto, checkpoint or none, got {park!r}")
    berth = berth or running_berth()
    if berth == "berth":
        warnings.append("the berth executable was not found; cmd lines run a bare 'berth', "
                        "which llama-swap (no shell) finds only on its own PATH; give "
                        "--berth /path/to/bin/berth")
    if park == "none":
        return park, berth, checkpoint_path
    found = find_checkpoint(checkpoint_path)
    if park == "auto":
        park = "checkpoint" if found else "none"
        notes.append(
            f"park: by checkpoint with {found} (cuda-checkpoint found)" if found else
            "park: none, so models drain (stop) to make room: cuda-checkpoint was not found "
            "(--checkpoint-path, $BERTH_CUDA_CHECKPOINT, PATH); install NVIDIA's cuda-checkpoint "
            "(driver 550 or later), or give --park checkpoint --checkpoint-path PATH, to park "
            "engines in host RAM instead")
    elif not found:
        warnings.append(f"--park checkpoint: {checkpoint_path or 'cuda-checkpoint'} was not found "
                        f"here; berth run refuses to start a model whose cuda-checkpoint it "
                        f"cannot find")
    return park, berth, found or checkpoint_path
