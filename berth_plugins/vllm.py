"""Built-in mechanism ``vllm``: vLLM's sleep mode as a park (park = "hook", adapter = "vllm").

Source: reference/park-mechanisms.md "vLLM sleep mode" (endpoints, protocol, hazards).

vLLM serves the sleep routes only when started with ``VLLM_SERVER_DEV_MODE=1`` and
``--enable-sleep-mode``; without them ``/sleep`` and ``/is_sleeping`` answer 404, which this
plugin reports as such.

- Park: ``POST /sleep?level=1&mode=wait`` (level 1 moves the weights to pinned host RAM and drops
  the KV cache; ``mode=wait`` lets a request still running finish on builds that know it), then
  poll ``GET /is_sleeping`` until ``{"is_sleeping": true}``: the sleep route can answer before
  the sleep is done (its FIXME).
- Wake: ``POST /wake_up`` (no tags: everything), then poll ``GET /is_sleeping`` until false, then,
  when ``ctx.options["warmup_model"]`` names the served model, one ``POST /v1/completions`` of one
  token (step 4 of the reference's unpark).

Neither ``is_sleeping`` nor a 200 proves the memory is free: the context and graph pools stay
(about 1.2 GiB at TP=1) and ``expandable_segments`` made sleep free nothing. The broker confirms
with a driver read (rule 1); this plugin only asks.

Quiesce is the caller's job: vLLM can die if ``/sleep`` arrives mid-decode (vllm#45520), so the
front is closed and the requests in flight are done before the park begins (rule 3).
"""

from __future__ import annotations

from typing import Awaitable

from ._http import Engine
from .hookspecs import ActionContext, hookimpl

NAME = "vllm"
_POLL_S = 0.05
_DEV_MODE = ("vLLM's sleep mode routes are absent (404): start vLLM with VLLM_SERVER_DEV_MODE=1 "
             "and --enable-sleep-mode")


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


async def _sleeping(eng: Engine) -> bool:
    ans = await eng.call("GET", "/is_sleeping")
    if ans.status == 404:
        raise eng.fail(f"GET /is_sleeping: {_DEV_MODE}")
    if not ans.ok:
        raise eng.fail(f"GET /is_sleeping answered {ans.status}: {ans.message()}")
    if not isinstance(ans.body, dict) or not isinstance(ans.body.get("is_sleeping"), bool):
        raise eng.fail(f"GET /is_sleeping: expected {{\"is_sleeping\": bool}}, got {ans.text[:200]!r}")
    return ans.body["is_sleeping"]


async def _until(eng: Engine, want: bool, after: str) -> None:
    """Poll ``/is_sleeping`` until it reads ``want``; raise when the deadline passes first."""
    async def reached() -> bool:
        return await _sleeping(eng) == want

    await eng.wait_for(reached, lambda: f"{after} answered, but /is_sleeping still read "
                                        f"{str(not want).lower()} within {eng.ctx.timeout_s:g} s",
                       _POLL_S)


async def _park(ctx: ActionContext) -> None:
    async with Engine(ctx) as eng:
        ans = await eng.call("POST", "/sleep?level=1&mode=wait")
        if ans.status == 404:
            raise eng.fail(f"POST /sleep: {_DEV_MODE}")
        if not ans.ok:
            raise eng.fail(f"POST /sleep?level=1 answered {ans.status}: {ans.message()}")
        await _until(eng, True, "POST /sleep")


async def _wake(ctx: ActionContext) -> None:
    async with Engine(ctx) as eng:
        ans = await eng.call("POST", "/wake_up")
        if ans.status == 404:
            raise eng.fail(f"POST /wake_up: {_DEV_MODE}")
        if not ans.ok:   # e.g. 500 out of memory on wake
            raise eng.fail(f"POST /wake_up answered {ans.status}: {ans.message()}")
        await _until(eng, False, "POST /wake_up")
        model = ctx.options.get("warmup_model")
        if model:
            await eng.expect_ok("POST", "/v1/completions",
                                {"model": model, "prompt": "hi", "max_tokens": 1},
                                what="one-token warm-up")


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Sleep at level 1 and wait for ``is_sleeping``; raises :class:`MechanismError` on a 404
    (dev mode off), any other error answer, or ``is_sleeping`` still false at the deadline."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """Wake everything, wait for ``is_sleeping`` false, optionally warm up with one token."""
    return _wake(ctx) if ctx.mechanism == NAME else None
