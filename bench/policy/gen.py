"""Write the workloads under ``bench/policy/workloads/`` (the files are committed).

    python bench/policy/gen.py [--seed N] [--out DIR]

Without ``--seed``, the committed set: a-d and issue 34's shapes from seed 8, issue 24's shapes
(e-i) with the parameters their live tests were written with. ``--seed N`` draws every one of
them from N (:func:`build_every`; :mod:`.shapes` for e onward). Four hour-long workloads (the
issue's a, b, c and d); every figure below is a parameter of the generator, written into each
file's ``generator`` section:

- ``a-one-card``: one 24 GiB card; two chat models (14 GiB and 8 GiB declared) and a
  ComfyUI-like engine that loads 11 GiB and grows to 18 GiB while it renders (and keeps it:
  PyTorch's caching allocator). Chat sessions of several turns, and image sessions of 1-4 jobs
  of 20-60 s.
- ``b-four-cards``: four 24 GiB cards, eight engines, one of them spanning three cards
  (17.5 GiB loaded, 20 GiB declared on each). That one declares no park: a multi-process
  tensor/pipeline-parallel engine cannot be checkpointed (reference/park-mechanisms.md:
  "NCCL multi-process jobs hang, and TP>1 restores fail", cuda-checkpoint #27, #30, #45).
- ``c-length-shift``: one 24 GiB card, two chat models; short chats for the first half hour,
  then batches of long documents (seed 000: "a system that switches from short chat responses
  to long document generations changes the distribution without changing any configuration").
- ``d-home-box``: one 24 GiB card at home, four engines: a chat model, a coder, a ComfyUI-like
  engine, and an always-on embedder (1.5 GiB, an editor's or a notes app's index: small batches
  all hour long) that its user marks ``priority = 1`` with ``keep_warm = "5m"``.

Request growth is KV cache (bytes per token × context tokens) or activations. Chat turns carry
their session's history, so a session's later turns hold more KV. Arrivals are open-loop: a
session's next turn arrives after the previous turn's service time plus a think time, as if
served at once. The growth allowance of seed 000's ``growth`` bound is set per engine, as an
operator would: the 95th percentile of one request's growth seen in the first quarter of the
trace (the calibration window).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "bench.policy"

from .workload import CardSpec, EngineSpec, GiB, Mechanisms, MiB, RequestSpec, Workload  # noqa: E402

__all__ = ["build_all", "build_every", "main", "WORKLOADS", "COMMITTED_SEED"]

KiB = 1 << 10
CARD_BYTES = 24 * GiB
RESERVE_BYTES = 1 * GiB
COMMITTED_SEED = 8
WORKLOADS = ("a-one-card", "b-four-cards", "c-length-shift", "d-home-box")


def _pci(i: int) -> str:
    return f"0000:{i + 1:02x}:00.0"


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _engine(name, cards, size_gib, base_gib, **kw) -> EngineSpec:
    size = {_pci(c): int(size_gib * GiB) for c in cards}
    base = {_pci(c): int(base_gib * GiB) for c in cards}
    return EngineSpec(name=name, size_bytes=size, base_bytes=base, **kw)


def chat_sessions(rng, out, engine, *, t0, t1, every_s, turns_mean, user_tokens, reply_tokens,
                  kv_bytes_per_token, decode_tps, max_growth_bytes, prefill_tps=2000.0):
    """Chat sessions, Poisson-started every ``every_s`` on average; each turn's context is the
    history plus the new message and reply (capped by the engine's KV pool)."""
    t = t0 + rng.expovariate(1 / every_s)
    while t < t1:
        turns = min(12, 1 + int(rng.expovariate(1 / max(turns_mean - 1, 1e-9))))
        at, history = t, 0
        for _ in range(turns):
            user = _loguniform(rng, *user_tokens)
            reply = _loguniform(rng, *reply_tokens)
            ctx = history + user + reply
            growth = min(int(ctx * kv_bytes_per_token), max_growth_bytes)
            service = user / prefill_tps + reply / decode_tps
            out.append(RequestSpec(at, engine, service, growth, service, "chat"))
            history = ctx
            at += service + rng.uniform(10, 60)
            if at >= t1:
                break
        t += rng.expovariate(1 / every_s)


def doc_batches(rng, out, engine, *, t0, t1, every_s, batch, gap_s, doc_tokens, reply_tokens,
                kv_bytes_per_token, decode_tps, max_growth_bytes, prefill_tps=2000.0):
    """Batches of long-document requests (a folder of documents to summarise), Poisson-started
    every ``every_s``; the documents of a batch arrive ``gap_s`` apart."""
    t = t0 + rng.expovariate(1 / every_s)
    while t < t1:
        at = t
        for _ in range(rng.randint(*batch)):
            doc = rng.uniform(*doc_tokens)
            reply = rng.uniform(*reply_tokens)
            growth = min(int((doc + reply) * kv_bytes_per_token), max_growth_bytes)
            service = doc / prefill_tps + reply / decode_tps
            out.append(RequestSpec(at, engine, service, growth, service, "document"))
            at += rng.uniform(*gap_s)
        t += rng.expovariate(1 / every_s)


def job_sessions(rng, out, engine, *, t0, t1, every_s, jobs, gap_s, service_s, growth_bytes,
                 ramp_s, kind):
    """Sessions of 1..n jobs (image renders, transcriptions, embedding batches): each next job
    is submitted ``gap_s`` after the previous one, whether or not it has run."""
    t = t0 + rng.expovariate(1 / every_s)
    while t < t1:
        at = t
        for _ in range(rng.randint(*jobs)):
            service = rng.uniform(*service_s)
            out.append(RequestSpec(at, engine, service, int(rng.uniform(*growth_bytes)),
                                   min(ramp_s, service), kind))
            at += rng.uniform(*gap_s)
        t += rng.expovariate(1 / every_s)


def _with_allowance(engines, reqs, calib_s) -> tuple[EngineSpec, ...]:
    """Set each engine's growth allowance: p95 of one request's per-card growth in the
    calibration window, rounded up to a MiB."""
    out = []
    for e in engines:
        g = sorted(max(e.growth_split(r.growth_bytes).values()) for r in reqs
                   if r.engine == e.name and r.t_s < calib_s)
        a = g[min(len(g) - 1, int(math.ceil(0.95 * len(g))) - 1)] if g else 0
        out.append(EngineSpec(**{**e.__dict__, "growth_allowance_bytes": -(-a // MiB) * MiB}))
    return tuple(out)


def _cards(n: int) -> tuple[CardSpec, ...]:
    return tuple(CardSpec(_pci(i), f"gpu{i}", CARD_BYTES, RESERVE_BYTES) for i in range(n))


def _finish(name, description, seed, duration_s, host_ram_gib, cards, engines, reqs, params):
    reqs.sort(key=lambda r: (r.t_s, r.engine))
    reqs = [r for r in reqs if r.t_s < duration_s]
    engines = _with_allowance(engines, reqs, duration_s / 4)
    return Workload(name=name, description=description, seed=seed, duration_s=duration_s,
                    host_ram_bytes=host_ram_gib * GiB, cards=cards, engines=engines,
                    requests=tuple(reqs), mechanisms=Mechanisms(),
                    generator={**params, "calibration_window_s": duration_s / 4}).validate()


CHAT14 = dict(user_tokens=(30, 1500), reply_tokens=(60, 900), kv_bytes_per_token=160 * KiB,
              decode_tps=35.0)
CHAT8 = dict(user_tokens=(30, 1500), reply_tokens=(60, 900), kv_bytes_per_token=64 * KiB,
             decode_tps=60.0)
IMAGES = dict(jobs=(1, 4), gap_s=(5, 30), service_s=(20, 60), growth_bytes=(5 * GiB, 7 * GiB),
              ramp_s=3.0, kind="image")


def workload_a(seed: int) -> Workload:
    rng = random.Random(seed)
    engines = (
        _engine("chat-14", [0], 14, 10.5, slots=4, note="14 GiB chat model; KV 160 KiB/token"),
        _engine("chat-8", [0], 8, 6.5, slots=4, note="8 GiB chat model; KV 64 KiB/token"),
        _engine("comfy", [0], 18, 11, slots=1, retain_growth=True,
                note="ComfyUI-like: loads 11 GiB, grows to 18 GiB rendering, keeps it"),
    )
    reqs: list[RequestSpec] = []
    T = 3600.0
    chat_sessions(rng, reqs, "chat-14", t0=0, t1=T, every_s=150, turns_mean=5,
                  max_growth_bytes=int(3.5 * GiB), **CHAT14)
    chat_sessions(rng, reqs, "chat-8", t0=0, t1=T, every_s=200, turns_mean=5,
                  max_growth_bytes=int(1.5 * GiB), **CHAT8)
    job_sessions(rng, reqs, "comfy", t0=0, t1=T, every_s=300, **IMAGES)
    params = {"chat-14": {"sessions_every_s": 150, "turns_mean": 5, **CHAT14},
              "chat-8": {"sessions_every_s": 200, "turns_mean": 5, **CHAT8},
              "comfy": {"sessions_every_s": 300, **IMAGES}}
    return _finish("a-one-card", "One 24 GiB card: two chat models (14 and 8 GiB) and a "
                   "ComfyUI-like engine that grows to 18 GiB; bursty chat sessions and image "
                   "sessions of 20-60 s jobs.", seed, T, 64, _cards(1), engines, reqs, params)


def workload_b(seed: int) -> Workload:
    rng = random.Random(seed)
    big_note = ("spans three cards; multi-process TP/PP, so no park (cuda-checkpoint #27, #30, "
                "#45: NCCL jobs hang, TP>1 restores fail)")
    # Every engine may be placed on any cards by a policy that places (issue 25); the cards
    # named here are where a policy that cannot place runs it (an operator's static choice).
    engines = tuple(replace(e, free=True) for e in (
        _engine("coder-14", [0], 14, 10.5, slots=4, note="KV 160 KiB/token"),
        _engine("chat-8", [0], 8, 6.5, slots=4, note="KV 64 KiB/token"),
        _engine("embed-1.5", [0], 1.5, 1.25, slots=8, note="embeddings: short batches"),
        _engine("big-60", [1, 2, 3], 20, 17.5, slots=4, park=None, note=big_note),
        _engine("comfy", [1], 18, 11, slots=1, retain_growth=True, note="ComfyUI-like"),
        _engine("chat-12", [2], 12, 9, slots=4, note="KV 128 KiB/token"),
        _engine("whisper-4", [3], 4, 3, slots=1, note="transcription jobs"),
        _engine("vision-10", [3], 10, 8, slots=2, note="vision-language; KV 96 KiB/token"),
    ))
    reqs: list[RequestSpec] = []
    T = 3600.0
    big = dict(user_tokens=(30, 1500), reply_tokens=(60, 900), kv_bytes_per_token=320 * KiB,
               decode_tps=12.0)
    c12 = dict(user_tokens=(30, 1500), reply_tokens=(60, 900), kv_bytes_per_token=128 * KiB,
               decode_tps=40.0)
    vis = dict(user_tokens=(600, 2500), reply_tokens=(40, 400), kv_bytes_per_token=96 * KiB,
               decode_tps=30.0)
    emb = dict(jobs=(1, 8), gap_s=(0.5, 3), service_s=(0.2, 1.5),
               growth_bytes=(16 * MiB, 96 * MiB), ramp_s=0.2, kind="embed")
    wsp = dict(jobs=(1, 3), gap_s=(2, 20), service_s=(10, 40), growth_bytes=(0.5 * GiB, 1 * GiB),
               ramp_s=2.0, kind="audio")
    chat_sessions(rng, reqs, "coder-14", t0=0, t1=T, every_s=180, turns_mean=5,
                  max_growth_bytes=int(3.5 * GiB), **CHAT14)
    chat_sessions(rng, reqs, "chat-8", t0=0, t1=T, every_s=200, turns_mean=5,
                  max_growth_bytes=int(1.5 * GiB), **CHAT8)
    job_sessions(rng, reqs, "embed-1.5", t0=0, t1=T, every_s=30, **emb)
    chat_sessions(rng, reqs, "big-60", t0=0, t1=T, every_s=300, turns_mean=4,
                  max_growth_bytes=int(7.5 * GiB), **big)
    job_sessions(rng, reqs, "comfy", t0=0, t1=T, every_s=360, **IMAGES)
    chat_sessions(rng, reqs, "chat-12", t0=0, t1=T, every_s=240, turns_mean=5,
                  max_growth_bytes=3 * GiB, **c12)
    job_sessions(rng, reqs, "whisper-4", t0=0, t1=T, every_s=300, **wsp)
    chat_sessions(rng, reqs, "vision-10", t0=0, t1=T, every_s=400, turns_mean=3,
                  max_growth_bytes=2 * GiB, **vis)
    params = {"coder-14": {"sessions_every_s": 180, **CHAT14},
              "chat-8": {"sessions_every_s": 200, **CHAT8},
              "embed-1.5": {"sessions_every_s": 30, **emb},
              "big-60": {"sessions_every_s": 300, "turns_mean": 4, **big},
              "comfy": {"sessions_every_s": 360, **IMAGES},
              "chat-12": {"sessions_every_s": 240, **c12},
              "whisper-4": {"sessions_every_s": 300, **wsp},
              "vision-10": {"sessions_every_s": 400, "turns_mean": 3, **vis}}
    return _finish("b-four-cards", "Four 24 GiB cards, eight engines; big-60 spans gpu1-gpu3 "
                   "and can only be drained.", seed, T, 256, _cards(4), engines, reqs, params)


def workload_c(seed: int) -> Workload:
    rng = random.Random(seed)
    engines = (
        _engine("chat-a", [0], 16, 8, slots=4, note="KV 160 KiB/token, 8 GiB pool"),
        _engine("chat-b", [0], 12, 6, slots=4, note="KV 128 KiB/token, 6 GiB pool"),
    )
    reqs: list[RequestSpec] = []
    T, shift = 3600.0, 1800.0
    a = dict(kv_bytes_per_token=160 * KiB, decode_tps=35.0)
    b = dict(kv_bytes_per_token=128 * KiB, decode_tps=40.0)
    short = dict(user_tokens=(30, 600), reply_tokens=(40, 400))
    docs = dict(batch=(2, 6), gap_s=(0.5, 5), doc_tokens=(12000, 30000), reply_tokens=(300, 1200))
    chat_sessions(rng, reqs, "chat-a", t0=0, t1=shift, every_s=90, turns_mean=4,
                  max_growth_bytes=8 * GiB, **short, **a)
    chat_sessions(rng, reqs, "chat-b", t0=0, t1=shift, every_s=120, turns_mean=4,
                  max_growth_bytes=6 * GiB, **short, **b)
    doc_batches(rng, reqs, "chat-a", t0=shift, t1=T, every_s=120, max_growth_bytes=8 * GiB,
                **docs, **a)
    doc_batches(rng, reqs, "chat-b", t0=shift, t1=T, every_s=150, max_growth_bytes=6 * GiB,
                **docs, **b)
    params = {"shift_s": shift,
              "chat-a": {"short_sessions_every_s": 90, "doc_batches_every_s": 120, **short, **docs, **a},
              "chat-b": {"short_sessions_every_s": 120, "doc_batches_every_s": 150, **short, **docs,
                         **b}}
    return _finish("c-length-shift", "One 24 GiB card, two chat models: short chats for 30 min, "
                   "then long documents (seed 000's distribution shift).", seed, T, 64,
                   _cards(1), engines, reqs, params)


def workload_d(seed: int) -> Workload:
    rng = random.Random(seed)
    engines = (
        _engine("chat-14", [0], 14, 10.5, slots=4, note="KV 160 KiB/token"),
        _engine("coder-8", [0], 8, 6.5, slots=4, note="KV 64 KiB/token"),
        _engine("comfy", [0], 18, 11, slots=1, retain_growth=True, note="ComfyUI-like"),
        _engine("embed", [0], 1.5, 1.25, slots=8, priority=1, keep_warm_s=300.0,
                note="always-on embedder: priority 1, keep_warm 5 min"),
    )
    reqs: list[RequestSpec] = []
    T = 3600.0
    emb = dict(jobs=(1, 6), gap_s=(0.5, 3), service_s=(0.2, 1.0),
               growth_bytes=(16 * MiB, 64 * MiB), ramp_s=0.2, kind="embed")
    chat_sessions(rng, reqs, "chat-14", t0=0, t1=T, every_s=240, turns_mean=5,
                  max_growth_bytes=int(3.5 * GiB), **CHAT14)
    chat_sessions(rng, reqs, "coder-8", t0=0, t1=T, every_s=200, turns_mean=6,
                  max_growth_bytes=int(1.5 * GiB), **CHAT8)
    job_sessions(rng, reqs, "comfy", t0=0, t1=T, every_s=600, **IMAGES)
    job_sessions(rng, reqs, "embed", t0=0, t1=T, every_s=20, **emb)
    params = {"chat-14": {"sessions_every_s": 240, "turns_mean": 5, **CHAT14},
              "coder-8": {"sessions_every_s": 200, "turns_mean": 6, **CHAT8},
              "comfy": {"sessions_every_s": 600, **IMAGES},
              "embed": {"sessions_every_s": 20, **emb}}
    return _finish("d-home-box", "One 24 GiB card at home: a chat model, a coder, a "
                   "ComfyUI-like engine and an always-on embedder (priority 1, keep_warm 5 min).",
                   seed, T, 64, _cards(1), engines, reqs, params)


def build_all(seed: int) -> dict[str, Workload]:
    """Every workload from ``seed`` (each gets ``seed * 1000 + its index``)."""
    makers = (workload_a, workload_b, workload_c, workload_d)
    return {name: make(seed * 1000 + i) for i, (name, make) in enumerate(zip(WORKLOADS, makers, strict=True))}


def build_every(seed: int | None) -> dict[str, Workload]:
    """Every workload, a-d and the shapes, from ``seed``; ``None``: the committed set (module
    docstring)."""
    from .shapes import build_shapes
    return {**build_all(COMMITTED_SEED if seed is None else seed), **build_shapes(seed)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None,
                    help=f"draw every workload from this seed (default: the committed set: "
                         f"seed {COMMITTED_SEED}, issue 24's shapes as their live tests have them)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "workloads"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, wl in build_every(args.seed).items():
        path = out / f"{name}.json"
        wl.dump(path)
        Workload.load(path)
        print(f"{path}: {len(wl.requests)} requests, {len(wl.clients)} closed-loop clients over "
              f"{wl.duration_s:.0f} s, {len(wl.engines)} engines on {len(wl.cards)} cards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
