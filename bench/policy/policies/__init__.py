"""The policies the simulator compares, by name (:data:`POLICIES`, in table order)."""

from __future__ import annotations

from functools import partial

from .berth import KNOBS, BerthPolicy, default_policy
from .current import CurrentNeedPolicy
from .keepalive import KeepAlivePolicy
from .swap import SwapPolicy

__all__ = ["POLICIES", "BERTH", "DEFAULT", "PEERS", "KNOBS", "make"]

#: Berth as a new install configures it (see :func:`.berth.default_policy`).
DEFAULT = "berth-default"
#: The peers the default is held against (each at zero OOM only).
PEERS = ("swap", "swap-matrix", "keepalive-evict")

#: The six Berth configurations: queue policy × bound.
BERTH = tuple(f"berth-{q}-{b}" for q in ("strict", "scan")
              for b in ("declared", "current", "growth"))

POLICIES = {
    "swap": partial(SwapPolicy, "group"),
    "swap-matrix": partial(SwapPolicy, "matrix"),
    "keepalive-evict": KeepAlivePolicy,
    "current-need": CurrentNeedPolicy,
    DEFAULT: default_policy,
    **{name: partial(BerthPolicy, *name.split("-")[1:]) for name in BERTH},
}


def make(name: str, berth_knobs: dict | None = None):
    """A fresh policy object by name; ``berth_knobs`` override :data:`KNOBS` for the Berth
    configurations. Raises ``KeyError`` listing the known names."""
    if name not in POLICIES:
        raise KeyError(f"policy {name!r}: expected one of {', '.join(POLICIES)}")
    if (name in BERTH or name == DEFAULT) and berth_knobs:
        return POLICIES[name](berth_knobs)
    return POLICIES[name]()
