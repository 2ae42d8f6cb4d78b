"""The decision model's kinds and constants that are read without the model: the config schema
(``bound``, ``[policy] queue``, ``keep_warm``, a card's name) and the text board (a counter's
words). Their homes re-export them (:mod:`.model`, :mod:`.admission`, :mod:`.measures`); here
they cost no dataclass, so ``berth status`` and the other commands that only read berth.toml do
not build the model's (issue 38: a tenth of ``berth status``'s own start-up CPU).
"""

from __future__ import annotations

import enum

from .pci import normalize_pci

__all__ = ["Bound", "QueuePolicy", "DEFAULT_KEEP_WARM_S", "names_card",
           "REJECTED_WITH_FREE_WORDS"]


class Bound(enum.StrEnum):
    """Admission bounds of seed 000 "Admission bounds and their honesty"."""

    DECLARED = "declared"   # reserve the declared maximum: the only guarantee
    CURRENT = "current"     # reserve the measured need only
    GROWTH = "growth"       # measured need + an allowance; extended when use passes it


class QueuePolicy(enum.StrEnum):
    STRICT = "strict"
    SCAN = "scan"


#: How long a priority protects an idle holder after its last request by default (seconds):
#: Ollama's keep_alive default, so an engine marked important stays as warm as there.
DEFAULT_KEEP_WARM_S = 300.0

#: ``admissions_rejected_with_free`` in words, wherever a user reads it (``berth status``, the
#: board, the metric's help): what it counts. "refused while memory was free" read as berthd
#: turning requests away from an empty card; the metric's name is kept for dashboards.
REJECTED_WITH_FREE_WORDS = "waited with some memory free, not enough"


def names_card(key: str, pci: str, name: str) -> bool:
    """Whether ``key`` names the card whose normalised PCI address is ``pci`` and whose short
    name is ``name``: its name, or any spelling of its PCI address (:func:`normalize_pci`).
    The one rule for every place a user names a card: a ``[cards.X]`` key, an engine's
    ``card``, ``--size SIZE@CARD``."""
    if key == name:
        return True
    try:
        return normalize_pci(key) == pci
    except ValueError:
        return False
