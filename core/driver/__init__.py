"""Driver backends behind one interface (:mod:`berth.driver.base`): NVML and simulated cards.

The names below load :mod:`berth.driver.base` when first used (PEP 562): it imports asyncio, and
the stand-in cuda-checkpoint, a process per park and wake, reads only :mod:`berth.driver.cuda`'s
error numbers (issue 38).
"""

from __future__ import annotations

# Not typing's TYPE_CHECKING: nothing else the stand-in cuda-checkpoint loads imports typing,
# whose import was a tenth of its start (type checkers take a constant of this name as true).
TYPE_CHECKING = False

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


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from berth.driver import base
    return getattr(base, name)
