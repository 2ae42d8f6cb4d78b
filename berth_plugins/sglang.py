"""Built-in mechanism ``sglang``: SGLang's memory release as a park (park = "hook",
adapter = "sglang").

Source: reference/park-mechanisms.md "SGLang" (flags, calls, behaviour, protocol).

- Park: ``POST /pause_generation {"mode": "abort"}`` (old builds lack it: a 404 is tolerated),
  then ``POST /release_memory_occupation {}`` (empty: every tag, ``kv_cache``, ``weights`` and
  ``cuda_graph``). If the release fails after the pause, ``POST /continue_generation`` is sent
  (best effort) so the engine is not left paused, then the failure is raised.
- Wake: ``POST /resume_memory_occupation {}``, then ``POST /continue_generation`` (404
  tolerated, as for the pause).

``ctx.options["admin_key"]``, when set, goes as ``Authorization: Bearer <key>`` (newer builds
require the admin key if one is configured). SGLang answers an exception with
``400 {"error": {"message": …}}``; that message is quoted in the
:class:`~berth_plugins.hookspecs.MechanismError`.

The engine needs ``--enable-memory-saver`` (without it a release frees nothing, sglang#4336) and
``--enable-weights-cpu-backup`` (correct weights after resume). A 200 proves nothing: memory can
stay charged after it (radixark/miles PR #86). The broker confirms with a driver read (rule 1).

Quiesce is the caller's job: SGLang's scheduler asserts that no request is running, so the front
is closed and the requests in flight are done before the park begins (rule 3).
"""

from __future__ import annotations

from typing import Awaitable

from ._http import Answer, Engine
from .hookspecs import ActionContext, MechanismError, hookimpl

NAME = "sglang"


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


def _engine(ctx: ActionContext) -> Engine:
    key = ctx.options.get("admin_key")
    return Engine(ctx, {"Authorization": f"Bearer {key}"} if key else None)


def _failure(eng: Engine, path: str, ans: Answer) -> MechanismError:
    hint = ""
    if ans.status in (401, 403):
        hint = (" (the engine wants its admin key: set admin_key for this engine)"
                if not eng.ctx.options.get("admin_key") else " (the admin key was refused)")
    return eng.fail(f"POST {path} answered {ans.status}: {ans.message()}{hint}")


async def _post(eng: Engine, path: str, body: dict | None, tolerate_404: bool = False) -> bool:
    """POST; True on 2xx, False on a tolerated 404; raises on anything else."""
    ans = await eng.call("POST", path, body)
    if ans.ok:
        return True
    if ans.status == 404 and tolerate_404:
        return False
    raise _failure(eng, path, ans)


async def _park(ctx: ActionContext) -> None:
    async with _engine(ctx) as eng:
        paused = await _post(eng, "/pause_generation", {"mode": "abort"}, tolerate_404=True)
        try:
            await _post(eng, "/release_memory_occupation", {})
        except MechanismError:
            if paused:   # give the engine back its generation loop; the broker will drain it
                try:
                    await _post(eng, "/continue_generation", {}, tolerate_404=True)
                except MechanismError:
                    pass   # the release's error is the one to report
            raise


async def _wake(ctx: ActionContext) -> None:
    async with _engine(ctx) as eng:
        await _post(eng, "/resume_memory_occupation", {})
        await _post(eng, "/continue_generation", {}, tolerate_404=True)


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Pause (abort) and release every tag; raises :class:`MechanismError` quoting SGLang's
    ``error.message`` on a refusal."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """Resume every tag and continue generation; raises :class:`MechanismError` on a refusal."""
    return _wake(ctx) if ctx.mechanism == NAME else None
