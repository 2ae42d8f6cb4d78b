"""Driver backends behind one interface (:mod:`berth.driver.base`): NVML and simulated cards.

The names below load :mod:`berth.driver.base` when first used (PEP 562): it imports asyncio, and
the stand-in cuda-checkpoint, a process per park and wake, reads only :mod:`berth.driver.cuda`'s
error numbers (issue 38).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["UNKNOWN", "BytesBack", "CardInfo", "Driver", "DriverError", "PidsGone", "Reading",
           "UseAtMost", "confirm"]

if TYPE_CHECKING:
    from berth.driver.base import (
                       UNKNOWN,
                       BytesBack,
                       CardInfo,
                       Driver,
                       DriverError,
                       PidsGone,
                       Reading,
                       UseAtMost,
                       confirm,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from berth.driver import base
    return getattr(base, name)
