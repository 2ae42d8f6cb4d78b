"""The driver over simulated cards (``[driver] kind = "sim"``): reads :mod:`berth.sim.cards`.

Source: issue 3; seed 002 rule 1. The store plays the part of the NVIDIA driver: its free bytes
are ``total − baseline − Σ allocations`` on the card, and a process that exited keeps its memory
(and its PID in the process list) until the store's free delay has passed, as a real driver frees
asynchronously to a kill. Checkpointed processes hold nothing on the card and are absent from the
list, like a suspended process in ``nvidia-smi``. PIDs are real PIDs of this machine.
"""

from __future__ import annotations

import os
import time

import psutil
from berth.decide.model import normalize_pci
from berth.driver.base import CardInfo, Driver, DriverError, Reading
from berth.sim.cards import SimCards, SimError

__all__ = ["SimDriver"]


class SimDriver(Driver):
    """Reads the simulated cards in ``directory`` (default ``$BERTH_SIM_DIR``, else
    ``<state dir>/sim``). Every failure — no cards declared, an unknown PCI, a corrupt state
    file — is a :class:`DriverError`."""

    kind = "sim"

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 list_exited: bool = True):
        self.store = SimCards(directory)
        #: False: a process that exited leaves the process list at once, while its memory is
        #: still counted until the store frees it (real drivers do; issue 24's late free).
        self.list_exited = list_exited

    def cards(self) -> list[CardInfo]:
        """Every declared card, in PCI order. ``model`` reads ``Berth sim card <name>``."""
        try:
            snap = self.store.snapshot()
        except SimError as e:
            raise DriverError(str(e)) from None
        infos = [CardInfo(pci=c.spec.pci, uuid=c.spec.uuid, model=f"Berth sim card {c.spec.name}",
                          total_bytes=c.spec.total_bytes, free_bytes=c.free_bytes, index=c.index)
                 for c in snap.cards]
        return sorted(infos, key=lambda c: c.pci)

    def read(self, pci: str) -> Reading:
        """Free bytes and ``{pid: bytes}`` of card ``pci`` now; ``at`` is ``time.monotonic()``
        after the read. Raises :class:`DriverError` naming the card."""
        try:
            norm = normalize_pci(pci)
        except ValueError as e:
            raise DriverError(str(e), pci=str(pci)) from None
        try:
            st = self.store.read(norm)
        except SimError as e:
            raise DriverError(str(e), pci=norm) from None
        procs = dict(st.processes)
        if not self.list_exited:
            procs = {pid: b for pid, b in procs.items() if _running(pid)}
        return Reading(pci=norm, at=time.monotonic(), free_bytes=st.free_bytes,
                       total_bytes=st.spec.total_bytes, processes=procs)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
