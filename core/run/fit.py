"""A llama-server bounded to its lease: its ``--fit`` told to leave free what is not the lease.

Source: issue 37 "llama-server sizes itself to what is free". llama-server's ``--fit`` is on by
default: at start it chooses the unset ``-ngl`` and ``-c`` so that each card keeps
``--fit-target`` MiB free (1024 by default). Two engines Berth lets start one after the other then
each take what was free at their start, not their lease. ``berth run`` recognises llama-server in
its command (after ``env``, ``nice`` or a wrapper such as ``berth-sim-charge --``, and so in a
command ``berth llama-swap wrap`` wrote) and, unless the command pins the fit itself, adds
``--fit-target`` per granted card: the card's free memory at the grant less the lease's share, so
that what llama-server fills is the lease. A command that pins ``-c`` is sized with
:func:`berth.size.estimate` and a context that needs more than the lease is said at start.
"""

from __future__ import annotations

import os

from berth.decide.units import format_size

__all__ = ["bound", "find_server", "pinned", "mismatch"]

MiB = 1 << 20

_FIT = ("-fit", "--fit")
_TARGET = ("-fitt", "--fit-target")
_NGL = ("-ngl", "--gpu-layers", "--n-gpu-layers")
_CTX = ("-c", "--ctx-size")
_PARALLEL = ("-np", "--parallel")
_MODEL = ("-m", "--model")
#: llama-server reads every flag from an environment variable as well (its --help's "env:").
_ENV = {"LLAMA_ARG_FIT": _FIT, "LLAMA_ARG_FIT_TARGET": _TARGET,
        "LLAMA_ARG_N_GPU_LAYERS": _NGL, "LLAMA_ARG_CTX_SIZE": _CTX,
        "LLAMA_ARG_N_PARALLEL": _PARALLEL, "LLAMA_ARG_MODEL": _MODEL}


def find_server(cmd: list[str]) -> int | None:
    """The index in ``cmd`` of the word that runs llama-server (its base name), or ``None``."""
    for i, word in enumerate(cmd):
        if os.path.basename(word) == "llama-server":
            return i
    return None


def _value(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value ``words`` give the flag ``names`` (``-c 4096`` or ``--ctx-size=4096``; the
    last wins, as in llama.cpp's parser), or ``None``."""
    got = None
    for i, w in enumerate(words):
        name, eq, val = w.partition("=")
        if name in names:
            got = val if eq else (words[i + 1] if i + 1 < len(words) else "")
    return got


def _flags(cmd: list[str], at: int, env: dict[str, str]) -> dict[tuple[str, ...], str]:
    """The fit-related flags the llama-server at ``cmd[at]`` is given: by its own words, by
    ``VAR=value`` words before it (``env VAR=value llama-server``), or by ``env``."""
    words = cmd[at + 1:]
    pre = dict(w.split("=", 1) for w in cmd[:at] if "=" in w and not w.startswith("-"))
    out = {}
    for var, names in _ENV.items():
        v = _value(words, names)
        if v is None:
            v = pre.get(var, env.get(var))
        if v is not None:
            out[names] = v
    return out


def pinned(cmd: list[str], env: dict[str, str]) -> str | None:
    """Why the llama-server in ``cmd`` is left as written (it pins its own fit), or ``None``
    when ``berth run`` should bound it (also ``None`` for a command with no llama-server)."""
    at = find_server(cmd)
    if at is None:
        return None
    f = _flags(cmd, at, env)
    if _FIT in f:
        return f"it sets --fit {f[_FIT]}"
    if _TARGET in f:
        return f"it sets --fit-target {f[_TARGET]}"
    if _NGL in f and _CTX in f:
        return f"it sets -ngl {f[_NGL]} and -c {f[_CTX]}: --fit has nothing to choose"
    return None


def bound(cmd: list[str], cards: list[dict], env: dict[str, str]) -> tuple[list[str], str | None]:
    """``cmd`` with ``--fit-target`` added after llama-server when it is there and pins no fit
    of its own, and the line that says so (``None`` when nothing was added). ``cards``: the
    grant's (``{"name", "bytes", "free_bytes"}``, bytes), in ``CUDA_VISIBLE_DEVICES`` order; a
    card whose free memory berthd did not give leaves the command alone."""
    at = find_server(cmd)
    if at is None or pinned(cmd, env) or not cards:
        return cmd, None
    if any(c.get("free_bytes") is None or not c.get("bytes") for c in cards):
        return cmd, None
    margins = [max(0, int(c["free_bytes"]) - int(c["bytes"])) // MiB for c in cards]
    target = ",".join(str(m) for m in margins)
    why = "; ".join(f"{c['name']}: {format_size(c['free_bytes'])} free at the grant less the "
                    f"lease's {format_size(c['bytes'])}" for c in cards)
    line = (f"llama-server bounded to its lease: --fit-target {target} MiB ({why}), so its "
            f"--fit fills the lease and no more (set --fit, --fit-target, or -ngl and -c to "
            f"choose yourself)")
    return cmd[:at + 1] + ["--fit-target", target] + cmd[at + 1:], line


def mismatch(cmd: list[str], cards: list[dict], env: dict[str, str]) -> str | None:
    """What a llama-server command pinning ``-c`` (with ``-m`` a GGUF file) needs by
    :func:`berth.size.estimate`, when that is more than the lease's first card (bytes), said
    with what to change; ``None`` otherwise (a file that cannot be read says nothing here)."""
    at = find_server(cmd)
    if at is None or not cards or not cards[0].get("bytes"):
        return None
    f = _flags(cmd, at, env)
    model, ctx = f.get(_MODEL), f.get(_CTX)
    try:
        slots = int(f.get(_PARALLEL) or 1)
        n_ctx = int(ctx) if ctx else 0
    except ValueError:
        return None
    if not model or n_ctx <= 0 or not os.path.isfile(model):
        return None
    from berth.size import estimate
    try:
        e = estimate(model, max(1, n_ctx // max(1, slots)), slots=max(1, slots))
    except (ValueError, OSError):
        return None
    lease = int(cards[0]["bytes"])
    if e.total_bytes <= lease:
        return None
    return (f"llama-server -c {n_ctx} with {os.path.basename(model)} needs about "
            f"{format_size(e.total_bytes)} (berth size {model} --ctx {n_ctx // max(1, slots)}"
            f"{f' --slots {slots}' if slots > 1 else ''}), more than its lease of "
            f"{format_size(lease)}: declare --size {e.declare} or lower -c")
