"""A Berth process's start with the garbage collector paused (issue 38).

A Berth process loads a few hundred modules as it starts (asyncio, aiohttp, pydantic, its own),
and CPython's collector, run at every 700 allocations more than frees, walks the growing heap
again and again meanwhile (berthd: about 125 collections, an eighth of its start-up CPU), for
almost no garbage: what loads lives as long as the process. The ``berth`` and ``berthd``
commands (:func:`berth.cli.main`) therefore :func:`pause` it as they start, and resume it with
:func:`started` before the command runs, unless its parser said :func:`keep_paused`: such a
command calls :func:`started` itself once it has loaded what it runs (berthd ready, ``berth run``
past its load, the stub engine listening), or exits first (``berth status``: one call).

:func:`started` freezes what is there (:func:`gc.freeze`) before the collector runs again:
later collections, and the one at exit, skip the start's objects, which live as long as the
process anyway (the first collection after the pause walked them all, 30 ms in berthd, and the
one at exit another 25 ms). A cycle among them that becomes garbage later is not freed: at most
what the start allocated. Only a process's own start pauses (:func:`berth.cli.main` called as
the console command, not by a caller in its own process); :func:`started` does nothing in a
process that did not pause.
"""

from __future__ import annotations

import gc

__all__ = ["pause", "keep_paused", "kept", "started"]

#: Whether :func:`pause` turned the collector off, and :func:`started` has not yet resumed it.
_paused = False


def pause() -> None:
    """Turn the collector off, if it is on, until :func:`started`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def keep_paused(parser) -> None:
    """Mark a command's parser: the command calls :func:`started` itself."""
    parser.set_defaults(gc_paused_until_started=True)


def kept(args) -> bool:
    """Whether the parsed command keeps the collector paused until it calls :func:`started`."""
    return bool(getattr(args, "gc_paused_until_started", False))


def started() -> None:
    """The process has loaded what it runs: freeze that, and collect again. A no-op unless
    :func:`pause` paused the collector (and for every call after the first)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
