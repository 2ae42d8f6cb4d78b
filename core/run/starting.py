"""A berthd that is starting: ``berth run`` waits for it rather than failing open.

Source: issue 37 "supervisord starts every program at once (Supervisor #122)"; issue 35 (five
programs starting together on a card: none exits for lack of room, the waiting ones are listed).
supervisord starts berthd and the engines' runs at the same moment, and berthd takes seconds to
answer on a busy machine (11 s seen on two loaded cores, most of it Python's imports). A run that
found no berthd then failed open: its engine ran unleased, and berthd, once up, granted the
other runs beside it (three 10 GiB engines on a 24 GiB card that fits two).

So before a run decides to fail open (:mod:`berth.run.failopen`) it looks for a berthd process
of its own socket (:func:`find`): a process whose command is berthd's (``berthd``, ``berth
daemon``, ``python -m berth daemon``) and whose socket, as its environment, user and
``--config`` give it (:func:`berth.paths.socket_path`), is the run's. Another user's berthd,
whose environment cannot be read, counts when the run's socket is the system one
(``/run/berth``). A berthd younger than :data:`STARTING_S` that does not answer yet is starting:
the run waits for it, saying so once, until it answers, exits or turns :data:`STARTING_S` old;
then the run decides as before. The safety goal of fail-open holds: with no berthd process, or a
berthd that has not answered within a minute of its start (hung), an engine that fits is never
left waiting on it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from berth import paths

__all__ = ["Starting", "find", "is_berthd", "STARTING_S"]

#: Seconds after its start during which a silent berthd counts as starting (its imports, its
#: state file, its first read of the cards), not as hung.
STARTING_S = 60.0


@dataclass(frozen=True)
class Starting:
    """A berthd process of the run's socket: ``pid``, ``age_s`` (seconds since it started)."""

    pid: int
    age_s: float


def is_berthd(argv: list[str]) -> int | None:
    """The index in ``argv`` of the word that names berthd's command (``berthd``, the
    ``berth`` of ``berth daemon``, the ``berth`` of ``python -m berth daemon``), or ``None``
    for any other command. Only the first three words are looked at: ``sh -c '... berth
    daemon'`` or ``berth run -- berth daemon`` is not berthd."""
    for i, word in enumerate(argv[:3]):
        name = os.path.basename(word)
        if name == "berthd":
            return i
        if name == "berth" or (word in ("berth", "berth.cli") and i and argv[i - 1] == "-m"):
            rest = [a for a in argv[i + 1:] if not a.startswith("-")]
            if rest[:1] == ["daemon"]:
                return i
    return None


def _config_arg(argv: list[str]) -> str | None:
    """``berth daemon --config PATH``'s PATH, if given."""
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def _its_socket(proc: psutil.Process, argv: list[str]) -> Path | None:
    """The socket berthd ``proc`` listens on once up, from its environment, user and
    ``--config``. ``None`` when that cannot be told (its config does not load: it exits soon).
    Raises ``psutil.AccessDenied`` for another user's process."""
    from berth.config import ConfigError, load_config
    env = proc.environ()
    uid = proc.uids().effective
    cwd = proc.cwd()
    named = _config_arg(argv)
    found = Path(cwd, named) if named else Path(cwd, paths.config_path(env, uid))
    try:
        cfg = load_config(found)[0] if found.exists() else None
    except (ConfigError, OSError):
        return None
    return Path(cwd, paths.socket_path(cfg, env, uid))


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def find(socket: Path, now: float | None = None) -> Starting | None:
    """The youngest berthd process of ``socket`` (see the module docstring), or ``None``.
    ``now``: wall-clock seconds (``time.time()``, as a process's start time is). Blocking
    (reads ``/proc``): call it in a thread. Never raises."""
    now = time.time() if now is None else now
    system = _same(Path(socket).parent, Path("/run/berth"))
    best: Starting | None = None
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        argv = proc.info.get("cmdline") or []
        if proc.pid == os.getpid() or is_berthd(argv) is None:
            continue
        try:
            its = _its_socket(proc, argv)
        except psutil.AccessDenied:
            its = socket if system else None
        except (psutil.Error, OSError):
            continue
        if its is None or not _same(its, socket):
            continue
        age = max(0.0, now - (proc.info.get("create_time") or now))
        if best is None or age < best.age_s:
            best = Starting(proc.pid, age)
    return best
