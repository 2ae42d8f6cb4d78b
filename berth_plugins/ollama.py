"""Built-in mechanism ``ollama``: one ``ollama serve`` as one engine, parked by unloading every
model it has loaded (park = "hook", adapter = "ollama").

Source: Ollama's API documentation (docs/api.md): "List Running Models" (``GET /api/ps``:
``{"models": [{"name", "model", "size", "size_vram", "expires_at", …}]}``) and "Unload a
model" (``POST /api/generate`` with the model, no prompt and ``"keep_alive": 0`` answers
``{"done": true, "done_reason": "unload"}``); ``ollama serve`` listens where ``OLLAMA_HOST``
says, so ``berth run`` gives it its port with ``env OLLAMA_HOST=127.0.0.1:{port} ollama serve``.
Not run against a real Ollama: the tests use the simulation kit's stand-in (``berth sim
ollama``), built from the same documentation.

- Park: ``GET /api/ps``; each model listed, ``POST /api/generate {"model": M, "keep_alive":
  0}``; then ``GET /api/ps`` until it lists none. A model's memory leaves the card when its
  runner process ends, which may be after Ollama answered and after ``/api/ps`` stopped listing
  it: the broker grants the room only after a driver read shows it free (rule 1).
- Wake: nothing. Ollama loads a model on the next request that names it, and the front lets
  the held request through once berthd has confirmed room (rule 2).

One engine holds every model Ollama loads: its lease's size is what they need together (the
board says "over its lease" when they pass it). Quiesce is the caller's job (rule 3): the front
is closed and its requests in flight done before the park; a request reaching Ollama around the
front would load its model again.
"""

from __future__ import annotations

from typing import Awaitable

from ._http import Answer, Engine
from .hookspecs import ActionContext, hookimpl

NAME = "ollama"
_POLL_S = 0.05


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


async def _loaded(eng: Engine) -> list[str]:
    """The models ``GET /api/ps`` lists (their ``model`` name, else ``name``)."""
    ans = await eng.call("GET", "/api/ps")
    if not ans.ok:
        raise eng.fail(f"GET /api/ps answered {ans.status}: {ans.message()}")
    models = ans.body.get("models") if isinstance(ans.body, dict) else None
    if not isinstance(models, list):
        raise eng.fail(f"GET /api/ps: expected {{\"models\": [...]}}, got {ans.text[:200]!r}")
    names = [m.get("model") or m.get("name") for m in models if isinstance(m, dict)]
    if any(not isinstance(n, str) or not n for n in names) or len(names) != len(models):
        raise eng.fail(f"GET /api/ps lists a model without a name: {ans.text[:200]!r}")
    return names


async def _unload(eng: Engine, model: str) -> None:
    ans: Answer = await eng.call("POST", "/api/generate",
                                 {"model": model, "keep_alive": 0, "stream": False})
    if ans.status == 404:           # gone meanwhile (deleted, or unloaded by its own timer)
        return
    if not ans.ok:
        raise eng.fail(f"POST /api/generate {{model: {model!r}, keep_alive: 0}} answered "
                       f"{ans.status}: {ans.message()}")


async def _park(ctx: ActionContext) -> None:
    async with Engine(ctx) as eng:
        for model in await _loaded(eng):
            await _unload(eng, model)
        left: list[str] = []

        async def none_loaded() -> bool:
            left[:] = await _loaded(eng)
            return not left

        await eng.wait_for(none_loaded, lambda: f"GET /api/ps still lists {', '.join(left)} "
                                                f"within {ctx.timeout_s:g} s of the unloads",
                           _POLL_S)


async def _wake(ctx: ActionContext) -> None:
    """Nothing to do: Ollama loads a model on the request that names it."""


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Unload every model ``/api/ps`` lists and wait until it lists none; raises
    :class:`~berth_plugins.hookspecs.MechanismError` on an error answer or a model still
    listed at the deadline. The memory is confirmed free by the broker's driver read."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """Nothing: the held request loads its model (room confirmed first, rule 2)."""
    return _wake(ctx) if ctx.mechanism == NAME else None
