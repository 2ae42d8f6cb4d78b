"""Placement: which card each share of a new lease goes on.

Source: issue 23 ("decide inside the single writer"; STYLE.md after llama-swap issue #946: a read
that gates a mutation is a bug), issue 7 (a request that adopts a running process). The scheduler
calls :func:`place` when it handles the request, inside berthd's single writer, so the choice is
made on the ledger as it is then, not on a read the control API took earlier.

The rule today, kept from the control API:

1. a share that names its card (PCI address or short name) goes there;
2. a share that names none, of a request that adopts a process already holding memory, goes
   on the card where that process holds the most bytes;
3. else on the card with the most room now (:meth:`~.ledger.Ledger.available`, then the
   largest capacity) among the cards whose capacity admits its size.

This module is the one place that rule lives: a later change (placement as a scored decision
at grant time) replaces :func:`place` and keeps its signature. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Ledger
from .model import Share
from .units import format_size

__all__ = ["Ask", "PlacementError", "place", "shares_for"]


@dataclass(frozen=True)
class Ask:
    """One share as a request asks for it: ``card`` a PCI address or short name (``None``:
    Berth places it), ``size_bytes`` (``None``: the whole card), ``need_bytes`` what it needs
    now under the ``current``/``growth`` bounds (``None``: its size)."""

    card: str | None
    size_bytes: int | None
    need_bytes: int | None = None


class PlacementError(ValueError):
    """A share that cannot be placed. ``field`` names it as the request does
    (``shares.<i>.card``, ``shares.<i>.size``); the message starts with it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def place(ledger: Ledger, asks: list[Ask], held: dict[str, int | None]) -> list[str]:
    """The PCI address of the card for each ask, in order (steps 1-3 of the module's rule).

    ``held``: bytes the adopted process already holds per card (``{}`` when the request adopts
    none; ``None`` where the driver cannot say). Raises :class:`PlacementError` naming the
    share: an unknown card, a card named twice, two unnamed shares that would go to the same
    card, a size of 0 bytes or less, or a size larger than every card's capacity."""
    out: list[str] = []
    for i, ask in enumerate(asks):
        if ask.card is not None:                                                 # (1)
            try:
                pci = ledger.card(ask.card).pci
            except KeyError as e:
                raise PlacementError(f"shares.{i}.card", e.args[0]) from None
            if pci in out:
                raise PlacementError(f"shares.{i}.card", f"card {ask.card!r} is named twice")
        else:
            pci = _unnamed(ledger, i, ask, held)
            if pci in out:
                raise PlacementError(f"shares.{i}.card", f"two shares name no card and both "
                                                         f"would go to {pci}; name each share's "
                                                         f"card (--size 14GiB@gpu0 --size "
                                                         f"10GiB@gpu1)")
        if ask.size_bytes is not None and ask.size_bytes <= 0:
            raise PlacementError(f"shares.{i}.size", "must be more than 0 bytes")
        out.append(pci)
    return out


def _unnamed(ledger: Ledger, i: int, ask: Ask, held: dict[str, int | None]) -> str:
    """Steps (2) and (3) for a share that names no card."""
    mine = {p: b for p, b in held.items() if b}
    if mine:                                                                     # (2)
        return max(mine, key=mine.get)
    fits = [p for p, c in ledger.cards.items()                                   # (3)
            if ask.size_bytes is None or ask.size_bytes <= c.capacity_bytes]
    if not fits:
        raise PlacementError(f"shares.{i}.size", f"{format_size(ask.size_bytes)} is larger than "
                                                 f"every card's capacity")
    return max(fits, key=lambda p: (ledger.available(p), ledger.cards[p].capacity_bytes))


def shares_for(asks: list[Ask], cards: list[str],
               held: dict[str, int | None]) -> tuple[dict[str, Share], dict[str, int]]:
    """The waiting shares of a new lease (by PCI address) and its need per card (bytes), from
    its asks placed on ``cards`` (:func:`place`); each share's use starts at what the adopted
    process holds there (``held``)."""
    shares: dict[str, Share] = {}
    need: dict[str, int] = {}
    for ask, pci in zip(asks, cards, strict=True):
        shares[pci] = Share(pci, ask.size_bytes or 0, whole_card=ask.size_bytes is None)
        shares[pci].used_bytes = held.get(pci)
        if ask.need_bytes is not None:
            need[pci] = ask.need_bytes
    return shares, need
