"""The listener's mapping file (``<state dir>/supervisor-listener.json``): which listener runs,
how many full syncs it made, and each program's lease, PID and "held down" mark (kept across
restarts of the listener; leases themselves are found again in berthd's status by PID). Written
atomically.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable

from berth.paths import write_atomic

__all__ = ["read_down", "write"]

log = logging.getLogger("berth.hosts.supervisor")


def read_down(path: Path) -> dict[str, bool]:
    """Engine name -> held down, from the file at ``path`` (empty if none or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the mapping file %s: %s", path, e)
        return {}
    return {name: bool(rec.get("down"))
            for name, rec in (data.get("programs") or {}).items() if isinstance(rec, dict)}


def write(path: Path, syncs: int, programs: Iterable) -> None:
    """Write the mapping file atomically: this listener, its syncs, each program's lease."""
    path = Path(path)
    data = {"listener_pid": os.getpid(), "syncs": syncs,
            "programs": {p.engine: {"program": p.name, "mode": p.mode, "lease": p.lease,
                                    "pid": p.pid, "down": p.down}
                         for p in programs}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, ensure_ascii=False).encode(), 0o644)
    except OSError as e:
        log.warning("cannot write the mapping file %s: %s", path, e)
