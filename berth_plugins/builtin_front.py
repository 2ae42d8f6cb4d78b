"""Built-in front decision: which requests are writes (need the engine awake).

Source: seed 002 "Fronts" ("A read (GET, HEAD, OPTIONS) never wakes the engine: monitors poll
engines every few seconds … and each poll would undo the sleep").

Registered last among the answers (``trylast``), so an adapter that knows its engine better
(ComfyUI's queue routes, say) answers first and this rule is the fallback.
"""

from __future__ import annotations

from .hookspecs import hookimpl

#: HTTP methods that never wake a sleeping engine.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_write(method: str) -> bool:
    """True unless ``method`` (any case) is GET, HEAD or OPTIONS."""
    return method.upper() not in READ_METHODS


@hookimpl(trylast=True)
def berth_front_is_write(engine: str, method: str, path: str) -> bool:
    """GET, HEAD and OPTIONS are reads; every other method is a write, whatever the path."""
    return is_write(method)
