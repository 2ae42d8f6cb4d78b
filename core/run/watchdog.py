"""The engine's watchdog: kills the engine's process group when ``berth run`` dies.

Source: issue 5 ("the engine never outlives berth run"); reference/llama-swap.md: llama-swap
SIGKILLs the run's process group after its unload timeout, and the engine's group is not that
group, so nothing else would stop it. ``berth run`` starts this watchdog in its own session
(out of reach of that group kill) with a pipe on its stdin. When the pipe closes, by any exit of
the run, the watchdog sends SIGKILL to the engine's group, if its leader is still the process
Berth started or its members remain (rule 6), then exits. It also exits once the group is gone.

    python -m berth.run.watchdog PGID START_TIME
"""

from __future__ import annotations

import os
import select
import signal
import sys


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m berth.run.watchdog PGID START_TIME", file=sys.stderr)
        return 2
    pgid, start_time = int(args[0]), float(args[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            if os.read(fd, 4096):
                continue
            break                                   # EOF: berth run is gone
        if not _group_alive(pgid):
            return 0                                # the engine ended; nothing to guard
    if not _group_alive(pgid):
        # The run stopped its engine first (let_watchdog_go, the usual end): no member is left
        # to kill, as signal_group would find by walking every process of the machine.
        return 0
    # Imported here, only for a group that is still there: psutil costs this process, started
    # once per engine start, more than the rest of its start.
    from berth.process import ProcessId, SignalRefused, signal_group
    leader = ProcessId(pgid, start_time)
    try:
        signal_group(leader, signal.SIGKILL)
        print(f"berth watchdog: berth run is gone; killed engine group {leader.pid}",
              file=sys.stderr)
    except (SignalRefused, ProcessLookupError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
