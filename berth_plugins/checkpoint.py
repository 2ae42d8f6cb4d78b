"""Built-in mechanism ``checkpoint``: NVIDIA's ``cuda-checkpoint`` as a park (park = "checkpoint").

Source: reference/park-mechanisms.md "cuda-checkpoint" (CLI r570, states, exit codes, protocol,
failure classes); seed 002 "Capabilities" (checkpoint needs a run's own front).

The tool: ``ctx.options["checkpoint_path"]`` (a path, or an argv list such as
``[python, "-m", "berth.sim.checkpoint"]``), else ``$BERTH_CUDA_CHECKPOINT``, else
``cuda-checkpoint`` on ``PATH``. It runs without a shell, one call per process (every CUDA
process of the engine's tree is targeted separately: ``ctx.pids``), each call bounded by the time
left of ``ctx.timeout_s``; a call that overruns is killed.

Park (the reference's steps 3–5; steps 1, 2 and 6 are the caller's):

1. Host RAM must hold a full copy: Σ ``ctx.use_bytes`` plus a margin (10 % + 1 GiB) must fit in
   ``ctx.ram_available_bytes`` (or ``psutil``'s available memory), else refused.
2. Per PID: ``--get-state``; a non-zero exit means the process uses no CUDA and is skipped.
3. ``--action lock --timeout MS``, expecting ``locked``; on failure, a process left ``locked`` is
   unlocked again and the park aborted.
4. ``--action checkpoint``, expecting ``checkpointed``; on failure a ``locked`` process is
   unlocked again (the engine runs on) and the park aborted. Before the engine's first
   checkpoint, a park berthd has called off (``ctx.call_off`` set: the waiter it was for has
   gone) unlocks what it locked and raises :class:`CalledOff` (issue 37); once a checkpoint has
   begun it runs to its end.

A step that exits 0 has led to its state; the state is read (``--get-state``) only after a
step that fails, to decide the undo: a park is three calls a process, a wake three.

Wake (the unpark's steps 2–3): refused unless ``ctx.room_confirmed`` (the broker read room on the
cards: a restore without room leaves the process stuck). Per PID: ``running`` is skipped;
``--action restore`` expecting ``locked``; ``--action unlock`` expecting ``running``. With
``ctx.options["device_map"]`` (``{old UUID: new UUID}``, every checkpointed card; issue 35) the
restore is ``--action restore --device-map OLD=NEW[,...]`` (driver 580+): onto other cards of
the same kind. A refusal (across kinds: CUDA error 801) leaves the process checkpointed; the
wake fails with the tool's reason, and the broker falls back to a drain, after which the run
starts the engine again (:func:`supports_device_map` says whether the tool has the option).

Exit statuses are 8 bits, so a CUDA error 304 arrives as 48, 401 as 145, 801 as 33; messages name
the CUDA error behind the status (:func:`berth.driver.cuda.cuda_error_of`). A ``failed`` state,
304 or 401, or an out-of-memory restore means the engine is dead: only stopping it helps.

An exit 0 is not proof the memory left the card: the broker confirms with a driver read that the
PID left the card and ``free`` rose (rule 1).

Quiesce is the caller's job: a checkpointed process blocks inside CUDA, so the front is closed
and the requests in flight are done before the lock (rule 3).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from typing import Awaitable

import psutil
from berth.decide.units import format_size
from berth.driver.cuda import (
    CUDA_ERRORS,
    ILLEGAL_STATE,
    NOT_SUPPORTED,
    OS_CALL_FAILED,
    OUT_OF_MEMORY,
    cuda_error_of,
)

from ._http import deadline_of
from .hookspecs import ActionContext, CalledOff, MechanismError, hookimpl

NAME = "checkpoint"
RUNNING, LOCKED, CHECKPOINTED, FAILED = "running", "locked", "checkpointed", "failed"
_STATES = (RUNNING, LOCKED, CHECKPOINTED, FAILED)
#: The state each action leads to (the reference's cycle).
_LEADS_TO = {"lock": LOCKED, "checkpoint": CHECKPOINTED, "restore": LOCKED, "unlock": RUNNING}
#: Host RAM kept free beyond the copy: a fraction of it plus a fixed amount (bytes).
RAM_MARGIN_FRACTION, RAM_MARGIN_BYTES = 0.10, 1 << 30
#: The lock's own ``--timeout`` (seconds) unless ``options["lock_timeout_s"]`` says otherwise;
#: never more than half the time left.
LOCK_TIMEOUT_S = 60.0
_DEAD_ERRORS = (OS_CALL_FAILED, ILLEGAL_STATE)
_QUOTE_CHARS = 300


@hookimpl
def berth_mechanisms() -> list[str]:
    return [NAME]


def tool_argv(ctx: ActionContext) -> list[str]:
    """The command that runs cuda-checkpoint (see the module docstring for the search order).
    Raises :class:`MechanismError` when none is found or ``checkpoint_path`` is malformed."""
    return argv_of(ctx.options)


def argv_of(options: dict) -> list[str]:
    """:func:`tool_argv` from an engine's options alone (``checkpoint_path``)."""
    given = options.get("checkpoint_path")
    if given:
        if isinstance(given, (str, os.PathLike)):
            return [os.fspath(given)]
        if isinstance(given, (list, tuple)) and given and all(isinstance(a, str) for a in given):
            return list(given)
        raise MechanismError(NAME, f"checkpoint_path: expected a path or a list of strings, "
                                   f"got {given!r}")
    env = os.environ.get("BERTH_CUDA_CHECKPOINT")
    if env:
        return [env]
    found = shutil.which("cuda-checkpoint")
    if found:
        return [found]
    raise MechanismError(NAME, "cuda-checkpoint not found: set checkpoint_path for the engine, "
                               "or $BERTH_CUDA_CHECKPOINT, or put cuda-checkpoint on PATH")


def describe_status(status: int) -> str:
    """A tool's exit status in words: ``48`` -> ``CUDA error 304 (OS call failed; exit status 48)``."""
    if status < 0:
        return f"killed by signal {-status}"
    code = cuda_error_of(status)
    if code is None:
        return f"exit status {status}"
    return f"CUDA error {code} ({CUDA_ERRORS[code]}; exit status {status})"


def check_ram(ctx: ActionContext) -> int:
    """Refuse a park that host RAM cannot hold: Σ ``ctx.use_bytes`` + margin must fit in the
    available RAM (bytes). Returns the bytes needed. Raises :class:`MechanismError`."""
    if not ctx.use_bytes:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: no measured use (ctx.use_bytes) to "
                                   "check host RAM against; a checkpoint copies it all to RAM")
    unknown = sorted(pci for pci, n in ctx.use_bytes.items() if n is None)
    if unknown:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: its use on {', '.join(unknown)} is "
                                   "unknown to the driver, so host RAM cannot be checked; "
                                   "refusing to checkpoint")
    need = sum(n for n in ctx.use_bytes.values() if n)
    margin = int(need * RAM_MARGIN_FRACTION) + RAM_MARGIN_BYTES
    available = (ctx.ram_available_bytes if ctx.ram_available_bytes is not None
                 else psutil.virtual_memory().available)
    if need + margin > available:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: host RAM cannot hold the checkpoint: "
                                   f"it needs {format_size(need)} + a margin of "
                                   f"{format_size(margin)}, and {format_size(available)} is "
                                   "available")
    return need


class _Tool:
    """cuda-checkpoint calls for one action, all within the action's deadline."""

    def __init__(self, ctx: ActionContext):
        self.ctx = ctx
        self.argv = tool_argv(ctx)
        self.deadline = deadline_of(ctx, time.monotonic())

    def fail(self, message: str, status: int | None = None) -> MechanismError:
        code = cuda_error_of(status) if status is not None and status >= 0 else None
        return MechanismError(NAME, f"engine {self.ctx.engine!r}: {message}",
                              exit_code=code if code is not None else status)

    async def run(self, *args: str) -> tuple[int, str, str]:
        """Run the tool with ``args``: (exit status, stdout, stderr). Kills it at the deadline."""
        left = self.deadline - time.monotonic()
        shown = " ".join(("cuda-checkpoint", *args))
        if left <= 0:
            raise self.fail(f"no time left within {self.ctx.timeout_s:g} s for `{shown}`")
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            raise self.fail(f"cannot run {self.argv[0]!r}: {e}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), left)
        except asyncio.TimeoutError:
            raise self.fail(f"`{shown}` did not finish within {left:.1f} s; killed it") from None
        finally:
            if proc.returncode is None:   # overran, or the caller gave up: never leave it running
                proc.kill()
                await proc.wait()
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def state(self, pid: int) -> tuple[str | None, str]:
        """``--get-state``: (state, "") or (None, why) when the tool exits non-zero (no CUDA)."""
        status, out, err = await self.run("--get-state", "--pid", str(pid))
        if status != 0:
            return None, f"{describe_status(status)}: {err.strip()[:_QUOTE_CHARS]}"
        state = out.strip()
        if state not in _STATES:
            raise self.fail(f"--get-state --pid {pid} printed {out.strip()[:80]!r}; expected one "
                            f"of {', '.join(_STATES)}")
        return state, ""

    async def act(self, action: str, pid: int, timeout_ms: int | None = None,
                  more: tuple[str, ...] = ()) -> tuple[int, str, str | None]:
        """``--action ACTION --pid PID [MORE]``; returns (exit status, stderr, state after).
        The state after is the one the action leads to when it exits 0, and is read with
        ``--get-state`` only after a failure (what to undo, and whether the engine is dead)."""
        extra = ("--timeout", str(timeout_ms)) if timeout_ms is not None else ()
        status, _, err = await self.run("--action", action, "--pid", str(pid), *extra, *more)
        # Exit 0 is the tool's word that the step is done, so no --get-state follows it: each
        # call starts a process that opens the driver (seconds on a loaded machine: modal PR
        # #3603), and a read after every step made a park or wake five calls a process, not
        # three. The broker still confirms a park's memory left the card with a driver read.
        after = _LEADS_TO[action] if status == 0 else (await self.state(pid))[0]
        return status, err.strip()[:_QUOTE_CHARS], after

    def dead(self, pid: int, what: str, status: int | None = None) -> MechanismError:
        return self.fail(f"pid {pid}: {what}; the engine is dead (cuda-checkpoint cannot recover "
                         "it): stop it", status)


def _failed_step(tool: _Tool, pid: int, action: str, status: int, err: str, after: str | None
                 ) -> MechanismError | None:
    """The dead-engine error for a failed step (state ``failed``, CUDA error 304 or 401), or None."""
    code = cuda_error_of(status) if status > 0 else None
    if after == FAILED or code in _DEAD_ERRORS:
        said = err or "no message"
        return tool.dead(pid, f"{action} failed with {describe_status(status)} ({said}), "
                              f"state now {after}", status)
    return None


async def _unlock_after(tool: _Tool, pid: int) -> str:
    """Best effort: unlock a process a failed park left locked. Returns what happened."""
    status, err, after = await tool.act("unlock", pid)
    if status == 0 and after == RUNNING:
        return "unlocked it again; the engine runs on"
    return f"unlocking it again failed too ({describe_status(status)}: {err}; state {after})"


async def _called_off(tool: _Tool, locked: list[int]) -> None:
    """Before a step that cannot be undone (a checkpoint): if berthd has called the park off
    (``ctx.call_off``), unlock the processes this park locked and raise :class:`CalledOff`
    (issue 37: a park begun for a waiter that has gone stops at the next step that can still
    be undone)."""
    if tool.ctx.call_off is None or not tool.ctx.call_off.is_set():
        return
    undone = [f"pid {pid}: {await _unlock_after(tool, pid)}" for pid in locked]
    raise CalledOff("called off before its checkpoint began: the waiter it was for has gone"
                    + (f" ({'; '.join(undone)})" if undone else ""))


async def _park_pid(tool: _Tool, pid: int, state: str, locked: list[int] | None) -> None:
    """Lock (from ``running``) and checkpoint ``pid``. ``locked``: the pids this park has
    locked, while none of the engine's is checkpointed (a call-off unlocks them); ``None``
    once one is: a call-off is then too late, the park runs to its end."""
    if state == FAILED:
        raise tool.dead(pid, "--get-state says failed")
    if state == RUNNING:
        left_s = tool.deadline - time.monotonic()
        lock_s = min(float(tool.ctx.options.get("lock_timeout_s", LOCK_TIMEOUT_S)), left_s / 2)
        status, err, after = await tool.act("lock", pid, max(int(lock_s * 1000), 1))
        if status != 0 or after != LOCKED:
            dead = _failed_step(tool, pid, "lock", status, err, after)
            if dead:
                raise dead
            undo = await _unlock_after(tool, pid) if after == LOCKED else f"state {after}"
            raise tool.fail(f"pid {pid}: lock failed with {describe_status(status)} ({err}); "
                            f"{undo}; park aborted", status)
        if locked is not None:
            locked.append(pid)
    if locked is not None:
        await _called_off(tool, locked)
    status, err, after = await tool.act("checkpoint", pid)
    if status == 0 and after == CHECKPOINTED:
        return
    dead = _failed_step(tool, pid, "checkpoint", status, err, after)
    if dead:
        raise dead
    why = (" (checkpoint is not supported here: x86_64 only, driver ≥ 570)"
           if cuda_error_of(status) == NOT_SUPPORTED else "")
    undo = await _unlock_after(tool, pid) if after == LOCKED else f"state {after}"
    raise tool.fail(f"pid {pid}: checkpoint failed with {describe_status(status)}{why} ({err}); "
                    f"{undo}; park aborted", status)


async def _park(ctx: ActionContext) -> None:
    check_ram(ctx)
    if not ctx.pids:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: no pids to checkpoint (ctx.pids is "
                                   "empty; one call per CUDA process of the engine's tree)")
    tool = _Tool(ctx)
    acted, skipped = [], {}
    locked: list[int] | None = []           # None once a process is checkpointed
    for pid in ctx.pids:
        state, why = await tool.state(pid)
        if state is None:
            skipped[pid] = why
            continue
        if state != CHECKPOINTED:
            await _park_pid(tool, pid, state, locked)
        locked = None
        acted.append(pid)
    if not acted:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: none of pids {ctx.pids} uses CUDA, "
                                   f"nothing to checkpoint ({skipped})")


async def _wake_pid(tool: _Tool, pid: int, state: str) -> None:
    if state == FAILED:
        raise tool.dead(pid, "--get-state says failed")
    if state == CHECKPOINTED:
        mapping = tool.ctx.options.get("device_map") or {}
        more = ("--device-map", ",".join(f"{a}={b}" for a, b in mapping.items())) \
            if mapping else ()
        status, err, after = await tool.act("restore", pid, more=more)
        if cuda_error_of(status) == OUT_OF_MEMORY:
            raise tool.dead(pid, f"restore ran out of memory ({err}); the process stays "
                                 "checkpointed and stuck (cuda-checkpoint#44)", status)
        if status != 0 or after != LOCKED:
            raise (_failed_step(tool, pid, "restore", status, err, after) or
                   tool.fail(f"pid {pid}: restore failed with {describe_status(status)} ({err}); "
                             f"state now {after}", status))
    status, err, after = await tool.act("unlock", pid)
    if status != 0 or after != RUNNING:
        raise (_failed_step(tool, pid, "unlock", status, err, after) or
               tool.fail(f"pid {pid}: unlock failed with {describe_status(status)} ({err}); "
                         f"state now {after}", status))


async def _wake(ctx: ActionContext) -> None:
    if not ctx.room_confirmed:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: restore refused: room not confirmed "
                                   "by a driver read (a restore without room leaves the process "
                                   "stuck checkpointed)")
    if not ctx.pids:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: no pids to restore (ctx.pids is empty)")
    tool = _Tool(ctx)
    seen, skipped = [], {}
    for pid in ctx.pids:
        state, why = await tool.state(pid)
        if state is None:
            skipped[pid] = why
            continue
        seen.append(pid)
        if state != RUNNING:
            await _wake_pid(tool, pid, state)
    if not seen:
        raise MechanismError(NAME, f"engine {ctx.engine!r}: none of pids {ctx.pids} has a CUDA "
                                   f"state to restore ({skipped})")


async def supports_device_map(argv: list[str], timeout_s: float = 5.0) -> bool:
    """Whether the tool ``argv`` restores onto another card: its ``--help`` names
    ``--device-map`` (cuda-checkpoint of driver 580+; issue 35). A tool that cannot be run,
    or does not answer within ``timeout_s``, does not."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, "--help", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    except OSError:
        return False
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        return False
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return b"--device-map" in out


@hookimpl
def berth_park(ctx: ActionContext) -> Awaitable[None] | None:
    """Check host RAM, then lock and checkpoint each CUDA process of ``ctx.pids``. Raises
    :class:`MechanismError` on a refusal or a failed step (see the module docstring)."""
    return _park(ctx) if ctx.mechanism == NAME else None


@hookimpl
def berth_wake(ctx: ActionContext) -> Awaitable[None] | None:
    """With ``ctx.room_confirmed``, restore and unlock each checkpointed process of ``ctx.pids``.
    Raises :class:`MechanismError` on a refusal or a failed step."""
    return _wake(ctx) if ctx.mechanism == NAME else None
