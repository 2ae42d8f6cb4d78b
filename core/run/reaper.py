"""``berth run`` as a child subreaper (issue 36): an engine that double-forks and calls
``setsid()`` stays in the run's process tree.

A module of its own, with nothing but ctypes: the run becomes a subreaper before its front
listens, and :mod:`berth.run.engine` imports aiohttp's client (0.15 s of a start that llama-swap's
first health poll, 250 ms after it starts the model's ``cmd``, times: bench/run_start.py).
"""

from __future__ import annotations

import ctypes

__all__ = ["become_subreaper", "is_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process (``berth run``) a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``):
    an engine's descendant whose parent exits (an engine that double-forks and calls
    ``setsid()`` to daemonize) is re-parented to the run rather than to init, so it stays in the
    run's process tree, its memory counts for the lease, and the run stops it with the engine
    (issue 36). Whether it took effect (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper (``PR_GET_CHILD_SUBREAPER``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER + 1, ctypes.byref(flag), 0, 0, 0) == 0 \
            and flag.value != 0
    except (OSError, AttributeError):
        return False
