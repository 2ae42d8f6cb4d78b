"""``berth size``: the memory to declare for an engine, from its GGUF file or from its run.

Source: issue 37 "No way to find a size". ``berth.toml`` and ``berth run --size`` want each
engine's memory; this command finds it two ways:

- **From a GGUF file** (llama.cpp's models): the file's tensors (read with ``gguf``, llama.cpp's
  own reader), the KV cache for a context length and a slot count, the compute buffers of one
  micro-batch, and the CUDA context, each with the formula that gave it (:func:`estimate`).
- **From a running engine** (a lease or an engine name): the high-water mark of its use as the
  driver measured it (``peak_bytes`` in ``berth status --json``), and a size to declare
  (:func:`suggest`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

from berth.decide.units import format_size

__all__ = ["Estimate", "Part", "estimate", "suggest", "arguments", "CACHE_TYPES", "missing_words",
           "CUDA_CONTEXT_BYTES", "far_from_peak"]

#: Bytes per element of the KV cache by llama.cpp's ``--cache-type-k/-v`` (ggml's block sizes:
#: q8_0 is 34 bytes per 32 values, q4_0 18 per 32).
CACHE_TYPES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
               "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}

#: What the driver counts for a process's CUDA context and the runtime's own buffers before
#: any model memory (a few hundred MiB on current drivers; the driver's per-process figure, which
#: Berth measures a lease by, includes it).
CUDA_CONTEXT_BYTES = 512 * 2**20

#: A suggestion from a measured peak: that much above it (a run's peak is one run's; growth
#: past it needs room), rounded up to this step.
HEADROOM = 0.10
ROUND_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Part:
    """One part of an estimate: its ``name``, ``bytes`` and the ``formula`` that gave them
    (with the figures filled in)."""

    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class Estimate:
    """The memory to declare for one GGUF at one context: ``parts`` (bytes each), their
    ``total_bytes``, ``notes`` a user should read (a context past the training length)."""

    path: str
    parts: tuple[Part, ...]
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def declare(self) -> str:
        """The size to declare, rounded up to a MiB step a user can write (``--size``)."""
        return _size_text(_round_up(self.total_bytes, 64 * 2**20))


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _size_text(n: int) -> str:
    """``n`` bytes as a ``--size`` word: whole GiB, else whole MiB."""
    if n % 2**30 == 0:
        return f"{n // 2**30}GiB"
    return f"{-(-n // 2**20)}MiB"


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def _per_layer(v, n_layer: int) -> list[int]:
    """A hyperparameter that GGUF stores as one number or one per layer."""
    if isinstance(v, list):
        return [int(x) for x in v][:n_layer] or [0] * n_layer
    return [int(v)] * n_layer


def _shape(reader, path: str) -> tuple[str, int, list[int], int, int, int, int]:
    """The hyperparameters a size needs: architecture, layers, kv heads per layer, heads,
    key and value dims per head, vocabulary. ``ValueError`` naming a missing one."""
    arch = _field(reader, "general.architecture")
    if not arch:
        raise ValueError(f"{path}: no general.architecture in the file: not a model GGUF")

    def hp(key: str, default=None):
        v = _field(reader, f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{path}: no {arch}.{key} in the file; cannot size its KV cache")
        return v

    n_layer = int(hp("block_count"))
    n_embd, n_head = int(hp("embedding_length")), _per_layer(hp("attention.head_count"), n_layer)
    n_head_kv = _per_layer(hp("attention.head_count_kv", hp("attention.head_count")), n_layer)
    head0 = max(n_head) or 1
    k_dim = int(hp("attention.key_length", n_embd // head0))
    v_dim = int(hp("attention.value_length", n_embd // head0))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 0
    return str(arch), n_layer, n_head_kv, head0, k_dim, v_dim, int(vocab)


def estimate(path: str, ctx: int, *, slots: int = 1, ubatch: int = 512,
             cache_type: str = "f16", cuda_context_bytes: int = CUDA_CONTEXT_BYTES) -> Estimate:
    """The memory llama.cpp needs for the GGUF at ``path`` with ``ctx`` tokens of context per
    slot and ``slots`` slots (llama-server ``-c ctx*slots -np slots``), all layers on the card.

    Parts (bytes): weights (the sum of the file's tensors), KV cache
    (``2 caches × layers × ctx × slots × kv_heads × head_dim × bytes per element``, per layer
    when the file gives per-layer head counts), compute (f32 logits and attention scores of
    one micro-batch: ``4 B × ubatch × (vocab + heads × ctx × slots)``, plus one row of logits
    per slot), and the CUDA context. Raises ``ValueError`` naming the field for a bad
    ``ctx``/``slots``/``ubatch``/``cache_type``, a file that is not GGUF or lacks a
    hyperparameter; ``OSError`` for a file that cannot be read. Source: issue 37.
    """
    for name, v in (("--ctx", ctx), ("--slots", slots), ("--ubatch", ubatch)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a whole number of at least 1, got {v!r}")
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"--cache-type: expected one of {', '.join(CACHE_TYPES)}, "
                         f"got {cache_type!r}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        # The reader's own error for a short or foreign file is about numpy dtypes and array
        # axes, which tells a user nothing about the file they gave.
        raise ValueError(f"{path}: not a GGUF file: it does not start with 'GGUF' (its first "
                         f"bytes are {magic!r}); berth size reads llama.cpp's .gguf files, "
                         f"not safetensors or PyTorch checkpoints")
    import gguf  # only here: `berth size` on a lease needs none of it
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, IndexError, TypeError) as e:
        raise ValueError(f"{path}: not a GGUF file llama.cpp can read ({e})") from None
    arch, n_layer, n_head_kv, head0, k_dim, v_dim, vocab = _shape(reader, path)
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    n_ctx = ctx * slots
    per_el = CACHE_TYPES[cache_type]
    kv_elems = sum(n_ctx * h * (k_dim + v_dim) for h in n_head_kv)
    kv = math.ceil(kv_elems * per_el)
    uniform = len(set(n_head_kv)) == 1
    kv_formula = (f"{n_layer} layers × {n_ctx} tokens ({ctx} × {slots} slots) × "
                  + (f"{n_head_kv[0]} kv heads" if uniform else "kv heads per layer")
                  + f" × ({k_dim} + {v_dim}) key+value dims × {per_el:g} B ({cache_type})")
    compute = 4 * ubatch * (vocab + head0 * n_ctx) + 4 * vocab * slots
    parts = (
        Part("weights", weights, f"the file's {len(reader.tensors)} tensors "
                                  f"({format_size(os.path.getsize(path))} on disk)"),
        Part("KV cache", kv, kv_formula),
        Part("compute buffers", compute,
             f"4 B × {ubatch} ubatch × ({vocab} vocab + {head0} heads × {n_ctx} tokens) "
             f"+ 4 B × {vocab} vocab × {slots} slots of logits"),
        Part("CUDA context", cuda_context_bytes, "the driver's per-process context and the "
                                                 "runtime's buffers (typical; --cuda-context)"),
    )
    notes = []
    train = _field(reader, f"{arch}.context_length")
    if train is not None and ctx > int(train):
        notes.append(f"--ctx {ctx} is past the model's training context {int(train)}")
    return Estimate(path, parts, tuple(notes))


def render_estimate(e: Estimate) -> str:
    """``berth size FILE``'s text: one line per part with its formula, then the total and the
    ``--size`` to declare."""
    width = max(len(p.name) for p in e.parts)
    lines = [f"{e.path}:"]
    lines += [f"  {p.name:<{width}}  {format_size(p.bytes):>10}  = {p.formula}" for p in e.parts]
    lines.append(f"  {'total':<{width}}  {format_size(e.total_bytes):>10}  "
                 f"({e.total_bytes} bytes)")
    lines += [f"  note: {n}" for n in e.notes]
    lines.append(f"declare: --size {e.declare}   (berth.toml: size = \"{e.declare}\")")
    return "\n".join(lines)


def suggest(peak_bytes: int) -> int:
    """The size to declare for an engine whose measured high-water mark is ``peak_bytes``
    (bytes): :data:`HEADROOM` above it, rounded up to :data:`ROUND_BYTES`."""
    return _round_up(math.ceil(peak_bytes * (1 + HEADROOM)), ROUND_BYTES)


def far_from_peak(size_bytes: int, peak_bytes: int | None,
                  ceiling: bool = False) -> str | None:
    """Why a declared ``size_bytes`` is far from the measured ``peak_bytes`` (bytes), or
    ``None``: the peak above the size, or, unless the size is a ``ceiling`` (a growth or
    current bound, which counts only what the engine needs), under half of it (a size that
    holds the card for nothing)."""
    if not peak_bytes or not size_bytes:
        return None
    if peak_bytes > size_bytes:
        return (f"its measured peak {format_size(peak_bytes)} is above its declared size "
                f"{format_size(size_bytes)}: declare {_size_text(suggest(peak_bytes))} "
                f"(`berth size` on it says more)")
    if peak_bytes < size_bytes / 2 and not ceiling:
        return (f"its measured peak {format_size(peak_bytes)} is under half its declared size "
                f"{format_size(size_bytes)}: {_size_text(suggest(peak_bytes))} would do")
    return None


def _find(st: dict, target: str) -> dict | None:
    for le in st["leases"]:
        if target in (le["id"], le["engine"]):
            return le
    return None


def render_lease(le: dict) -> str:
    """``berth size LEASE``'s text: per card its declared size, its use now and its measured
    peak, and the size to declare."""
    lines = [f"{le['engine']} ({le['id']}):"]
    peaks = []
    for sh in le["shares"]:
        peak = sh.get("peak_bytes")
        peaks.append(peak or 0)
        lines.append(f"  {sh.get('card_name') or sh['card']}: declared "
                     f"{format_size(sh['size_bytes'])}, using {format_size(sh['used_bytes'])}, "
                     f"measured peak {format_size(peak) if peak else 'none yet'}")
    if not any(peaks):
        lines.append("no measured peak yet: the driver has not read its use "
                     "(run a request through it first)")
        return "\n".join(lines)
    sizes = " ".join(f"--size {_size_text(suggest(p))}" for p in peaks if p)
    lines.append(f"suggested: {sizes}   ({HEADROOM:.0%} above the peak, rounded up to "
                 f"{format_size(ROUND_BYTES)})")
    return "\n".join(lines)


def missing_words(st: dict, target: str) -> str:
    """Why ``berth size TARGET`` has no lease to measure, from berthd's status JSON ``st``: an
    engine whose run is drained (listed under ``drained``, no lease) is said to be so, not
    unknown."""
    for run in st.get("drained") or []:
        if run.get("engine") == target:
            return (f"{target} is drained (its run waits behind its front with no lease, and "
                    f"its engine does not run): its peak is measured while it runs; ask again "
                    f"after its next request")
    names = ", ".join(sorted({x["engine"] for x in st["leases"]})) or "none"
    return f"no lease or engine {target!r} (engines now: {names}); give a .gguf file to size a model"


def _lease(target: str) -> int:
    from berth import client_sync
    st = client_sync.call("GET", "/v1/status")
    le = _find(st, target)
    if le is None:
        print(f"berth size: {missing_words(st, target)}", file=sys.stderr)
        return 1
    print(render_lease(le))
    return 0


def _go(args) -> int:
    target = args.target
    if os.path.isfile(target) or target.endswith(".gguf"):
        if args.ctx is None:
            print("berth size: --ctx: give the context length per slot, like --ctx 4096",
                  file=sys.stderr)
            return 2
        try:
            e = estimate(target, args.ctx, slots=args.slots, ubatch=args.ubatch,
                         cache_type=args.cache_type,
                         cuda_context_bytes=args.cuda_context)
        except FileNotFoundError:
            print(f"berth size: {target}: no such file", file=sys.stderr)
            return 2
        except OSError as exc:
            # strerror, not str(exc): "[Errno 21] ..." is Python's wording, not a user's.
            print(f"berth size: {target}: cannot read it ({exc.strerror or exc})",
                  file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"berth size: {exc}", file=sys.stderr)
            return 2
        print(render_estimate(e))
        return 0
    from berth.board_text import _run
    return _run(lambda a: _lease(a.target))(args)


def _bytes(text: str) -> int:
    from berth.decide.units import parse_size
    try:
        return int(parse_size(text, field="--cuda-context") or 0)
    except ValueError as e:
        # argparse names the argument itself ("argument --cuda-context: ...").
        raise argparse.ArgumentTypeError(str(e).removeprefix("--cuda-context: ")) from None


def arguments(p) -> None:
    """Fill ``berth size``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.description = ("The memory to declare for an engine: from a GGUF file and a context "
                     "length (weights, KV cache, compute buffers, each with its formula), or "
                     "from a running engine (its measured peak and a suggested size).")
    p.add_argument("target", metavar="FILE.gguf|LEASE_OR_ENGINE")
    p.add_argument("--ctx", type=int, help="context length per slot, in tokens (a GGUF file)")
    p.add_argument("--slots", type=int, default=1,
                   help="parallel slots (llama-server -np; default 1)")
    p.add_argument("--ubatch", type=int, default=512,
                   help="micro-batch in tokens (llama-server -ub; default 512)")
    p.add_argument("--cache-type", default="f16", choices=sorted(CACHE_TYPES),
                   help="KV cache element type (llama-server -ctk/-ctv; default f16)")
    p.add_argument("--cuda-context", type=_bytes, default=CUDA_CONTEXT_BYTES, metavar="SIZE",
                   help="the CUDA context and runtime buffers (default 512MiB; 0 on CPU)")
    p.set_defaults(func=_go)
