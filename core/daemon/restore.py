"""Writing the state file after every change and taking its leases back after a restart.

Source: seed 002 rule 5 (state survives the daemon), issue 4 "State that survives". The file
format is :mod:`berth.daemon.store`'s; what a share caught mid-transition becomes is a decision,
the scheduler's (:meth:`~berth.decide.scheduler.Scheduler.adopt`, given the measured use).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from berth.daemon import store
from berth.decide.admission import WaitKind
from berth.decide.effects import Effect
from berth.decide.model import Lease
from berth.decide.scheduler import Scheduler
from berth.driver.base import Driver
from berth.process import ProcessId, alive, tree_pids

__all__ = ["Loaded", "load", "persist", "restore"]

log = logging.getLogger("berth.daemon.broker")


@dataclass
class Loaded:
    """The state file as read at start: its snapshot (``None``: missing, unusable or from
    before a reboot's leases were dropped), where an unusable file was moved, and the ids of
    leases that did not survive."""

    snap: store.Snapshot | None
    quarantined: Path | None = None
    dropped: list[str] = field(default_factory=list)


def load(path: Path) -> Loaded:
    """Read the state file at ``path``. A corrupt file is moved aside (logged, never raised);
    leases written before a reboot are dropped (no process survives one)."""
    try:
        snap = store.load(path)
    except store.StateCorrupt as e:
        try:
            moved = store.quarantine(path)
        except OSError as why:      # cannot move it: start empty anyway, never crash-loop
            log.error("%s. Could not move it aside (%s); starting empty.", e, why)
            return Loaded(None)
        log.error("%s. Moved it aside to %s and starting empty; processes that still hold "
                  "memory will show as stowaways.", e, moved)
        return Loaded(None, quarantined=moved)
    if snap is not None and snap.refused:
        _keep_refused(path, snap.refused)
    if snap is not None and snap.boot_id and snap.boot_id != store.boot_id():
        log.warning("the state file was written before a reboot; no lease survives it")
        dropped = [le.id for le in snap.leases]
        snap.leases, snap.waiting = [], []
        return Loaded(snap, dropped=dropped)
    return Loaded(snap)


def _keep_refused(path: Path, refused: list[str]) -> None:
    """Say which lease entries were left out, and copy the file aside (``.refused-<unix
    time>``) before the next write replaces it: the entries are evidence."""
    import shutil
    import time
    copy = path.with_name(f"{path.name}.refused-{int(time.time())}")
    try:
        shutil.copyfile(path, copy)
        os.chmod(copy, 0o600)
    except OSError as e:
        copy = f"nowhere ({e})"
    for why in refused:
        log.error("the state file's %s: left out, the rest of the state kept (the file as it "
                  "was is copied to %s)", why, copy)


def persist(path: Path, sched: Scheduler, failing: str | None = None) -> str | None:
    """Write ``sched``'s leases, waiters, counters and baselines to ``path`` atomically. A
    failed write (a full disk, a read-only state directory) is logged, not raised: the broker
    keeps serving and the next change retries. ``failing`` is what the previous call returned:
    the same failure again is not logged again (it would be on every change), and the first
    write after a failure says the file is written again. Returns the failure's text, or
    ``None`` when written (issue 4 "State that survives")."""
    led = sched.ledger
    snap = store.Snapshot(
        leases=list(led.leases.values()),
        waiting=[(w.lease_id, w.kind.value, w.since) for w in sched.queue],
        counters=sched.counters.as_dict(),
        baselines={p: c.baseline_bytes for p, c in led.cards.items()},
        boot_id=store.boot_id())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        store.write_atomic(path, store.dump(snap))
    except OSError as e:
        why = e.strerror or str(e)
        if why != failing:
            # One line, no traceback: what a user fixes is the disk, not the code.
            log.error("cannot write the state file %s: %s; berthd keeps serving, but a restart "
                      "now would not re-attach the leases changed since (free space or make "
                      "%s writable; every change tries again)", path, why, path.parent)
        return why
    if failing is not None:
        log.info("the state file %s is written again", path)
    return None


def restore(snap: store.Snapshot | None, sched: Scheduler, driver: Driver,
            now: float) -> tuple[list[Lease], list[str], list[Effect]]:
    """Re-attach every lease of ``snap`` whose process still matches, with each card's measured
    use by its processes (``sched.adopt`` settles shares caught mid-transition by it, issue 4).
    Returns ``(adopted leases, ids dropped, effects to carry out)``. Raises the driver's
    :class:`~berth.driver.base.DriverError`."""
    if snap is None:
        return [], [], []
    # The counters are "since start" (the board says so): a new berthd starts them at zero
    # (issue 12 case 7); the state file keeps them only for whoever reads it.
    waiting = {lid: (kind, since) for lid, kind, since in snap.waiting}
    led = sched.ledger
    reads = {pci: driver.read(pci) for pci in led.cards}
    fx: list[Effect] = []
    adopted: list[Lease] = []
    dropped: list[str] = []
    for lease in snap.leases:
        if not _still_alive(lease) or any(p not in led.cards for p in lease.shares):
            dropped.append(lease.id)
            continue
        tree = tree_pids(lease.pid) if lease.pid else set()
        use = {pci: reads[pci].use_of(tree & set(reads[pci].processes))
               if reads[pci].processes_known else None for pci in lease.shares}
        kind, since = waiting.get(lease.id, (None, None))
        if lease.is_waiting() and kind is None:
            kind, since = WaitKind.GRANT, lease.requested_at
        fx += sched.adopt(lease, now, kind, since, use)
        adopted.append(lease)
    return adopted, dropped, fx


def _still_alive(lease: Lease) -> bool:
    if lease.pid is not None and lease.start_time is not None:
        return alive(ProcessId(lease.pid, lease.start_time))
    if lease.owner_pid is not None and lease.owner_start_time is not None:
        return alive(ProcessId(lease.owner_pid, lease.owner_start_time))
    return False
