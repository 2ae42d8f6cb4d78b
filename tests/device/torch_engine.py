"""A minimal engine for the device check: holds real GPU memory and proves it survives a park.

``python torch_engine.py --port PORT --gib N`` allocates N GiB on the card CUDA gives it
(``CUDA_VISIBLE_DEVICES``), fills it with seeded random bytes and sums them once. It then serves:

- ``GET /health``: 200 once the memory is filled;
- ``POST /v1/chat/completions``: sums the memory again and answers
  ``{"sum_at_start": int, "sum_now": int, "same": bool, "gib": N, "pid": int}``, so a client
  sees whether a checkpoint park and its restore kept every byte on the card.

Not collected by pytest (the name does not match ``test_*.py``); ``check_live.py`` starts it
under ``berth run``. Needs torch and aiohttp, both on the device machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from aiohttp import web

GiB = 1 << 30


def _sum(x: "torch.Tensor") -> int:
    """The bytes' sum, by 64 MiB chunks: ``sum(dtype=int64)`` casts its input first, so a whole
    tensor at once would need a temporary eight times its size."""
    step = 64 << 20
    total = sum(int(x[i:i + step].sum(dtype=torch.int64)) for i in range(0, x.numel(), step))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gib", type=float, required=True)
    a = p.parse_args()
    n = int(a.gib * GiB)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    # In place and by GiB: the first device check filled and summed the whole tensor at once,
    # and an int64 temporary eight times its size stayed in torch's caching allocator (the
    # engine held 126.6 GiB for a 14 GiB tensor; berthd rightly counted it at its use).
    for i in range(0, n, GiB):
        x[i:i + GiB].random_(0, 256, generator=gen)
    at_start = _sum(x)

    async def health(_req: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def chat(_req: web.Request) -> web.Response:
        now = _sum(x)
        return web.json_response({"sum_at_start": at_start, "sum_now": now,
                                  "same": now == at_start, "gib": a.gib, "pid": os.getpid()})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    main()
