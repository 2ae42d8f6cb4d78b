"""Built-in mechanism ``protocol``: the Berth engine protocol (park = "hook", lend = "hook").

Source: DESIGN.md "The Berth engine protocol"; seed 002 "Capabilities" (``lend`` = ``hook``, the
Berth protocol) and stage A2 (lends on one card through the protocol, with a stub engine).

JSON over HTTP on the engine's own port (``ctx.engine_url``, never its front):

- park: ``POST /berth/v1/park``; wake: ``POST /berth/v1/wake``;
- lend: ``POST /berth/v1/lend {"card": PCI, "bytes": N}`` once per card in ``ctx.bytes``;
- return: ``POST /berth/v1/return {"card": PCI, "bytes": N}`` likewise;
- quiet: ``GET /berth/v1/state`` answers, and reports no request in flight when it says.

A non-2xx answer raises :class:`~berth_plugins.hookspecs.MechanismError` quoting the engine's
``error.message``. A 200 is never taken as proof that memory moved: the broker confirms every
park and lend with a driver read (rule 1), so these calls only *ask*.

Quiesce is the caller's job: the front is closed and the requests in flight are done before a
park or a lend begins (rule 3); ``berth_quiet`` is a cheap extra check, not the drain itself.
"""

from __future__ import annotations

from typing import Awaitable

from berth.decide.units import format_size

from ._http import Engine
from .hookspecs import ActionContext, MechanismError, hookimpl

NAME = "protocol"
_PREFIX = "/berth/v1"


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


async def _post(ctx: ActionContext, op: str, body: dict | None = None) -> dict:
    async with Engine(ctx) as eng:
        ans = await eng.expect_ok("POST", f"{_PREFIX}/{op}", body, what=op)
        return ans.body if isinstance(ans.body, dict) else {}


async def _park(ctx: ActionContext) -> None:
    await _post(ctx, "park")


async def _wake(ctx: ActionContext) -> None:
    state = await _post(ctx, "wake")
    if state.get("state") == "parked":
        raise MechanismError(NAME, f"engine {ctx.engine!r}: POST {_PREFIX}/wake answered but the "
                                   "engine still reports state 'parked'")


async def _per_card(ctx: ActionContext, op: str) -> None:
    """One ``lend`` or ``return`` call per card of ``ctx.bytes`` (PCI -> bytes)."""
    if not ctx.bytes:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: {op} needs ctx.bytes "
                                   "(PCI address -> bytes), got none")
    async with Engine(ctx) as eng:
        for pci, n_bytes in ctx.bytes.items():
            if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes <= 0:
                raise eng.fail(f"{op}: bytes on {pci} must be a positive integer, got {n_bytes!r}")
            await eng.expect_ok("POST", f"{_PREFIX}/{op}", {"card": pci, "bytes": n_bytes},
                                what=f"{op} {format_size(n_bytes)} on {pci}")


async def _quiet(ctx: ActionContext) -> bool:
    async with Engine(ctx) as eng:
        ans = await eng.expect_ok("GET", f"{_PREFIX}/state", what="state")
    state = ans.body if isinstance(ans.body, dict) else {}
    return not state.get("in_flight")


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """``POST /berth/v1/park``; raises :class:`MechanismError` on a non-2xx answer."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """``POST /berth/v1/wake``; raises if it fails or the engine still says ``parked``."""
    return _wake(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_lend(ctx: ActionContext) -> Awaitable[None] | None:
    """``POST /berth/v1/lend`` for each card of ``ctx.bytes``, in order; stops at the first
    refusal (cards lent before it stay lent; the broker's driver read shows which)."""
    return _per_card(ctx, "lend") if ctx.mechanism == NAME else None


@hookimpl
def berth_return(ctx: ActionContext) -> Awaitable[None] | None:
    """``POST /berth/v1/return`` for each card of ``ctx.bytes``, in order."""
    return _per_card(ctx, "return") if ctx.mechanism == NAME else None


@hookimpl
def berth_quiet(ctx: ActionContext) -> Awaitable[bool] | None:
    """``GET /berth/v1/state``: True when it answers with no request in flight."""
    return _quiet(ctx) if ctx.mechanism == NAME else None
