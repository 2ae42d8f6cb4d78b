"""Driver backends behind one interface (:mod:`berth.driver.base`): NVML and simulated cards."""

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

__all__ = ["UNKNOWN", "BytesBack", "CardInfo", "Driver", "DriverError", "PidsGone", "Reading",
           "UseAtMost", "confirm"]
