"""The plugin contract: every hook Berth calls, in one file.

Source: DESIGN.md ("a small core broker exposes pluggy hookspecs (front, park, lend, wake)"),
seed 002 "Capabilities" and rules 1–4, reference/park-mechanisms.md, STYLE.md (pluggy habits).

Two kinds of hook:

- **Decision hooks** are synchronous and cheap. Those marked ``firstresult`` stop at the first
  non-``None`` result.
- **Action hooks** (park, wake, lend, return, drain, quiet) carry out a mechanism. Each
  implementation returns an *awaitable* when the action is its own (``ctx.mechanism`` names it),
  else ``None``. The caller gathers the awaitables and awaits them under ``ctx.timeout_s``.
  They are never ``firstresult``: an ``async def`` implementation returns a coroutine, which is
  never ``None``, so ``firstresult`` would stop at the first plugin whatever it meant. Write
  action hooks as plain ``def`` returning a coroutine or ``None``.

An action's success never frees memory by itself: the broker confirms every park, lend and
release with a driver read (rule 1). An action raises :class:`MechanismError` (or any
exception) to say it failed; the broker then falls back to a drain (rule 4).

The order of making room (fit, beside residual, lend, park, drain) is data in the core
(``berth.decide.ladder.RUNGS``), never plugin load order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable

import pluggy

PROJECT = "berth"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "hookspec", "hookimpl", "ActionContext", "MechanismError", "CalledOff"]


class MechanismError(RuntimeError):
    """A park, wake, lend, return or drain failed. ``mechanism`` names the plugin's mechanism
    and ``exit_code`` carries a tool's code where there is one (cuda-checkpoint's CUDA error)."""

    def __init__(self, mechanism: str, message: str, exit_code: int | None = None):
        super().__init__(f"{mechanism}: {message}")
        self.mechanism = mechanism
        self.exit_code = exit_code


class CalledOff(RuntimeError):
    """berthd called the park (or lend) off before a step that cannot be undone: what the
    mechanism had done is undone and the engine runs as before (issue 24; issue 37: the
    waiter it was for has gone). The message starts with ``called off``, the word berthd reads
    in the run's report."""


@dataclass
class ActionContext:
    """What an action hook needs to act on one engine run.

    - ``engine``: the engine's name (berth.toml entry or ``--engine``).
    - ``mechanism``: which plugin acts: ``"checkpoint"`` for park = checkpoint; for park =
      hook and lend, the adapter's name (an entry point of the group ``berth.adapters``:
      :mod:`berth_plugins.adapters`; ``berth run --help`` lists those installed); for a drain,
      ``"process"`` (berth run stops its own process group) or a host (``"supervisor"``).
    - ``engine_url``: the engine's own base URL (``http://127.0.0.1:PORT``), never its front.
    - ``pid`` / ``start_time``: the engine's main process as Berth started or adopted it.
    - ``pids``: every PID of the engine's process tree that the driver shows on its cards
      (cuda-checkpoint needs one call per CUDA process).
    - ``cards``: PCI addresses acted on; ``bytes``: PCI -> N for lend and return.
    - ``use_bytes``: PCI -> the engine's measured use before the action (host-RAM check).
    - ``ram_available_bytes``: host RAM a park may use now (``None``: not known).
    - ``room_confirmed``: for a wake or return, True once the broker has confirmed room on the
      cards with a driver read (a restore without room strands the process).
    - ``timeout_s``: the bound the caller awaits the action under.
    - ``options``: mechanism settings from config (``checkpoint_path``, ``admin_key``,
      ``model`` for llama.cpp's router, ``supervisor_program`` ...).
    - ``call_off``: for a park or lend, an ``asyncio.Event`` set when berthd calls the action
      off (its waiter has gone). A mechanism with steps looks at it before each step it cannot
      undo (a checkpoint), and, set, undoes what it did (an unlock) and raises
      :class:`CalledOff`; one step already begun runs to its end. ``None``: nothing calls it off.
    """

    engine: str
    mechanism: str
    engine_url: str | None = None
    pid: int | None = None
    start_time: float | None = None
    pids: list[int] = field(default_factory=list)
    cards: list[str] = field(default_factory=list)
    bytes: dict[str, int] = field(default_factory=dict)
    use_bytes: dict[str, int | None] = field(default_factory=dict)
    ram_available_bytes: int | None = None
    room_confirmed: bool = False
    timeout_s: float = 60.0
    options: dict = field(default_factory=dict)
    call_off: asyncio.Event | None = None


# ---------------------------------------------------------------------------------------------
# Registration and ownership (decision hooks)
# ---------------------------------------------------------------------------------------------

@hookspec
def berth_configure(config) -> None:
    """Take the validated ``berth.toml`` (a :class:`berth.config.Config`) before any other hook
    runs that needs it.

    berthd calls it once at startup, after the plugins are checked and before the control API
    serves (a host plugin reads its ``[hosts.X]`` table and the engine entries that name its
    programs here, e.g. the supervisord plugin for ``berth_vouch``). A host process that loads
    the plugins itself (``berth supervisor listen``) calls it too. Every implementation is
    called; results are ignored. Raise to refuse a config the plugin cannot use (berthd stops).
    Time bound: instant (no I/O beyond reading files).
    """


@hookspec
def berth_mechanisms() -> list[str]:
    """The mechanism names this plugin carries out (e.g. ``["checkpoint"]``; an adapter names
    itself, as its entry point in ``berth.adapters`` does).

    Called once at startup to check that every configured ``park``/``adapter`` has a plugin.
    Returns a list of names; all results are collected. Time bound: instant.
    """


@hookspec(firstresult=True)
def berth_vouch(pid: int, start_time: float, engine: str, host: str | None) -> bool | None:
    """Does this plugin vouch that ``pid`` (started at ``start_time``, seconds since the epoch)
    runs ``engine`` under its host?

    Asked when a client attaches a process it neither is nor parents (issue 4, "who may claim a
    process"). The supervisord plugin answers True only when supervisord's ``getProcessInfo``
    shows the same PID and start time. Stops at the first non-``None`` result: ``True`` vouches,
    ``False`` refuses, ``None`` abstains. Must not block for more than about a second.
    """


# ---------------------------------------------------------------------------------------------
# Fronts (decision hooks)
# ---------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def berth_front_is_write(engine: str, method: str, path: str) -> bool | None:
    """Does this request need the engine awake (a *write*)?

    A read never wakes an engine (seed 002 "Fronts": monitors poll every few seconds). The
    built-in answer: GET, HEAD and OPTIONS are reads, everything else is a write. An adapter may
    refine it (e.g. ComfyUI's ``POST /queue`` clear is not GPU work). Stops at the first
    non-``None`` result. Time bound: instant (it runs on the front's hot path).
    """


# ---------------------------------------------------------------------------------------------
# Actions (each returns an awaitable or None; never firstresult)
# ---------------------------------------------------------------------------------------------

@hookspec
def berth_quiet(ctx: ActionContext) -> Awaitable[bool] | None:
    """Confirm the engine is idle before it sleeps, beyond the front's own drain (ComfyUI's
    queue, a vLLM batch). The awaitable returns True when quiet. Bound: ``ctx.timeout_s``."""


@hookspec
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Move the engine's memory on ``ctx.cards`` to host RAM and back later (park).

    Called only after the front is closed and in-flight requests are done (rule 3). Checkpoint:
    lock with a timeout, checkpoint, check ``--get-state``, one call per PID in ``ctx.pids``,
    after checking host RAM admits ``ctx.use_bytes`` with a margin. Hooks: the adapter's sleep.
    Raises on failure. The broker judges "freed" by a driver read (rule 1).
    Bound: ``ctx.timeout_s`` (the release grace).
    """


@hookspec
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """Bring a parked engine back: restore + unlock, or the adapter's wake, then probe that it
    answers. Called only with ``ctx.room_confirmed`` (a failed restore strands the process).
    Raises on failure. Bound: ``ctx.timeout_s`` (the wake limit)."""


@hookspec
def berth_lend(ctx: ActionContext) -> Awaitable[None] | None:
    """Give ``ctx.bytes[pci]`` bytes on each card and keep serving (lend = hook, stage A2).
    Raises on failure. Bound: ``ctx.timeout_s`` (the release grace)."""


@hookspec
def berth_return(ctx: ActionContext) -> Awaitable[None] | None:
    """Grow back by ``ctx.bytes[pci]`` after the borrower's memory is confirmed gone (rule 2).
    Raises on failure. Bound: ``ctx.timeout_s`` (the wake limit)."""


@hookspec
def berth_drain(ctx: ActionContext) -> Awaitable[None] | None:
    """Stop the engine for good (``mechanism`` ``"supervisor"``: through supervisord's
    ``stopProcess``; ``berth run`` stops its own process group itself, rule 6). Returns once the
    stop was carried out; the broker waits for the driver to show the memory free.
    Bound: ``ctx.timeout_s``."""


@hookspec
def berth_start(ctx: ActionContext) -> Awaitable[None] | None:
    """Start an engine that Berth gates (supervisord's gate mode: ``startProcess`` once the
    lease is granted; a wake after a drain). Bound: ``ctx.timeout_s``."""
