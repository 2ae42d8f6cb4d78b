"""A stand-in for NVIDIA's ``cuda-checkpoint`` that acts on simulated cards.

Source: reference/park-mechanisms.md "cuda-checkpoint" (CLI r570, states, exit codes, failure
classes). Installed as ``berth-sim-cuda-checkpoint``; the command line is the real one::

    berth-sim-cuda-checkpoint --get-state --pid P
    berth-sim-cuda-checkpoint --toggle --pid P [--timeout MS]
    berth-sim-cuda-checkpoint --action lock|checkpoint|restore|unlock --pid P [--timeout MS]
    berth-sim-cuda-checkpoint --action restore --pid P --device-map OLD_UUID=NEW_UUID[,...]

``--device-map`` (driver 580+, issue 35) restores onto other simulated cards of the same kind
(the card's ``model``); across kinds it exits 801 and says why, the process left checkpointed.
``$BERTH_SIM_CHECKPOINT_NO_DEVICE_MAP=1`` plays an older tool without the option (a usage error).

States and cycle: running → lock → locked → checkpoint → checkpointed → restore → locked →
unlock → running (the simulation has no uncorrectable errors, so ``--get-state`` never prints
``failed``). ``--toggle`` is lock+checkpoint from ``running`` and restore+unlock from
``checkpointed``. ``--timeout`` applies to lock only (the simulated lock has no submitted work to
wait for, so it never times out by itself).

Exit codes: 0 on success; a failed action exits with the CUDA error number — 2 out of memory (a
restore onto a card without room: the process stays checkpointed and is stuck, later restores
exit 304 and unlock 401, as in cuda-checkpoint#44), 304 OS call failed, 401 illegal state, 801 not
supported. ``--get-state`` and every action exit 1 (``CUDA_ERROR_INVALID_VALUE``) for a process
without simulated CUDA memory; usage errors exit 1 too, so 2 always means out of memory. An exit
status is 8 bits, so a parent sees the number modulo 256 (304 → 48, 401 → 145, 801 → 33), as with
the real tool; :func:`berth.driver.cuda.cuda_error_of` maps a status back.

A move takes ``bytes / speed`` seconds: the speed is the store's ``restore_bytes_per_s``
(default 7e9 bytes/s), or ``$BERTH_SIM_CHECKPOINT_BPS``. Test knobs: ``$BERTH_SIM_CHECKPOINT_HANG_S``
sleeps that long before acting (so a caller's timeout fires); ``$BERTH_SIM_CHECKPOINT_UNSUPPORTED=1``
makes checkpoint exit 801, as on aarch64 (cuda-checkpoint#51); ``$BERTH_SIM_RESTORE_HOLD=PATH``:
a restore that has taken its memory and copied back does not finish while the file PATH exists
(looked for every 50 ms), so a test holds a move by restore open until it has seen it. The store
is ``$BERTH_SIM_DIR``, else ``<state dir>/sim``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from berth.driver.cuda import ILLEGAL_STATE, INVALID_VALUE, NOT_SUPPORTED
from berth.sim.cards import CHECKPOINTED, LOCKED, RUNNING, SimCards, SimError, SimOOM

__all__ = ["main", "run", "device_map"]


class _Usage(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # argparse would exit 2, which means out of memory here
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(INVALID_VALUE)


def _parser() -> argparse.ArgumentParser:
    p = _Usage(prog="cuda-checkpoint",
               description="Berth's stand-in cuda-checkpoint for simulated cards.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--toggle", action="store_true",
                      help="lock+checkpoint a running process, or restore+unlock a checkpointed one")
    what.add_argument("--get-state", action="store_true",
                      help="print running, locked or checkpointed")
    what.add_argument("--action", choices=["lock", "checkpoint", "restore", "unlock"])
    p.add_argument("--pid", type=int, required=True, help="the process (a PID, not a thread ID)")
    p.add_argument("--timeout", type=int, metavar="MS", help="lock timeout in milliseconds")
    if os.environ.get("BERTH_SIM_CHECKPOINT_NO_DEVICE_MAP") != "1":
        p.add_argument("--device-map", metavar="OLD_UUID=NEW_UUID[,...]",
                       help="restore onto other cards of the same kind (driver 580+): every "
                            "checkpointed card, by UUID")
    return p


def device_map(text: str | None) -> dict[str, str] | None:
    """``GPU-a=GPU-b,GPU-c=GPU-d`` -> ``{"GPU-a": "GPU-b", ...}``. Raises :class:`SimError` 1
    naming ``--device-map`` and the value."""
    if text is None:
        return None
    out: dict[str, str] = {}
    for pair in text.split(","):
        old, eq, new = pair.strip().partition("=")
        if not eq or not old.startswith("GPU-") or not new.startswith("GPU-"):
            raise SimError(f"--device-map: expected OLD_UUID=NEW_UUID[,...] with GPU-... UUIDs, "
                           f"got {text!r}", cuda_error=INVALID_VALUE)
        out[old] = new
    return out


def _env_float(name: str, default: float | None) -> float | None:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SimError(f"${name}: expected a number, got {text!r}") from None
    if value < 0:
        raise SimError(f"${name}: must be >= 0, got {text!r}")
    return value


def _move_s(store: SimCards, nbytes: int) -> float:
    bps = _env_float("BERTH_SIM_CHECKPOINT_BPS", None) or store.snapshot().restore_bytes_per_s
    return nbytes / bps


def _act(store: SimCards, action: str, pid: int, mapping: dict[str, str] | None = None) -> None:
    """One action; raises :class:`SimError` / :class:`SimOOM` carrying the CUDA error number."""
    if action == "lock":
        store.lock(pid)
    elif action == "unlock":
        store.unlock(pid)
    elif action == "checkpoint":
        if os.environ.get("BERTH_SIM_CHECKPOINT_UNSUPPORTED") == "1":
            raise SimError("checkpoint is not supported on this platform (simulated aarch64)",
                           cuda_error=NOT_SUPPORTED)
        state = store.state_of(pid)
        if state != LOCKED:   # fail before spending the copy time
            raise SimError(f"pid {pid} is {state}; checkpoint needs locked",
                           cuda_error=ILLEGAL_STATE)
        time.sleep(_move_s(store, store.bytes_of(pid)))   # copy out, then release the card
        store.checkpoint(pid)
    else:  # restore: the memory is claimed first, then the copy comes back in
        moved = store.restore(pid, mapping)
        time.sleep(_move_s(store, moved))
        hold = os.environ.get("BERTH_SIM_RESTORE_HOLD")
        while hold and os.path.exists(hold):    # the test knob: see the module docstring
            time.sleep(0.05)


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and act; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    if args.timeout is not None and args.timeout < 0:
        print(f"cuda-checkpoint: --timeout: must be >= 0 milliseconds, got {args.timeout}",
              file=sys.stderr)
        return INVALID_VALUE
    pid = args.pid
    try:
        store = SimCards()
        hang_s = _env_float("BERTH_SIM_CHECKPOINT_HANG_S", 0.0)
        if hang_s:
            time.sleep(hang_s)
        state = store.state_of(pid)
        if state is None:
            store.bytes_of(pid)   # raises the "no simulated CUDA memory" SimError
        if args.get_state:
            print(state)
            return 0
        if args.toggle:
            if state == RUNNING:
                steps = ["lock", "checkpoint"]
            elif state == CHECKPOINTED:
                steps = ["restore", "unlock"]
            else:
                raise SimError(f"pid {pid} is {state}; --toggle needs running or checkpointed",
                               cuda_error=ILLEGAL_STATE)
        else:
            steps = [args.action]
        mapping = device_map(getattr(args, "device_map", None))
        if mapping and "restore" not in steps:
            raise SimError("--device-map: only a restore takes it", cuda_error=INVALID_VALUE)
        for step in steps:
            _act(store, step, pid, mapping)
        return 0
    except SimOOM as e:
        print(f"cuda-checkpoint: could not restore process {pid}: CUDA error 2 "
              f"(out of memory): {e}", file=sys.stderr)
        return SimOOM.cuda_error
    except SimError as e:
        print(f"cuda-checkpoint: process {pid}: CUDA error {e.cuda_error}: {e}", file=sys.stderr)
        return e.cuda_error


def main() -> None:
    """Console entry point ``berth-sim-cuda-checkpoint``."""
    sys.exit(run())


if __name__ == "__main__":
    main()
