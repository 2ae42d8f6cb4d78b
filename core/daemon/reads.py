"""Driver reads turned into what the scheduler takes: each card's free bytes, stowaways and
every lease's use, found by process tree; and the holders that died.

Source: seed 002 rule 1 (only a driver read says memory moved), issue 4 "The broker loop",
issue 7 (processes a host started before their lease). The broker's reader task calls
:meth:`Reads.read_all` every ``read_interval`` and after every event; what it returns goes into
the single writer as ``observe``/``exited``.
"""

from __future__ import annotations

import logging

from berth.decide.effects import CardRead, Effect, Note, ReadCards, Until, Watch
from berth.decide.ledger import Ledger
from berth.decide.model import LIVE_STATES, Lease
from berth.decide.units import format_size
from berth.driver.base import Driver, DriverError, PidsGone, Reading, UseAtMost
from berth.process import (
    Ancestry,
    Liveness,
    ProcessId,
    process_name,
    program_and_user,
    tree_pids,
)

__all__ = ["Reads"]

log = logging.getLogger("berth.daemon.broker")


class Reads:
    """What berthd remembers between driver reads: the last read of each card
    (``last_reads``, by PCI address), the pids each lease was seen with on each card
    (``lease_pids``: lease id -> pci -> pids; a pid stays the lease's after it leaves the
    holder's tree), and the pids measured into each card's baseline at start
    (``baseline_pids``). Reads through ``driver``; raises its :class:`DriverError`."""

    def __init__(self, driver: Driver, ledger: Ledger):
        self.driver = driver
        self.ledger = ledger
        self.last_reads: dict[str, Reading] = {}
        self.lease_pids: dict[str, dict[str, set[int]]] = {}
        self.baseline_pids: dict[str, set[int]] = {}
        self._named: dict[int, tuple[str, tuple[str, str]]] = {}
        #: lease id -> pci -> {pid: bytes}: processes counted for a lease (seen in its tree
        #: before) that are outside its tree now, as the last read found them: its escapees.
        self.escapees: dict[str, dict[str, dict[int, int]]] = {}
        self._live = Liveness()

    def close(self) -> None:
        """Close what the reads hold open (a pidfd for each live holder and owner)."""
        self._live.close()

    def _who(self, pids: dict[int, int]) -> dict[int, tuple[str, str]]:
        """``(program, user)`` for each of ``pids`` (stowaways) as the process table names
        them, remembered while the PID stays a stowaway and its program the same (a read every
        interval would otherwise walk /proc for each); a process that cannot be read is left
        out (issue 37)."""
        for pid in [p for p in self._named if p not in pids]:
            del self._named[pid]
        for pid in pids:
            # A launcher that allocates and then execs its program (berth-sim-charge, a
            # wrapper script) keeps its PID: its name, which exec changes, says when to ask again.
            name = process_name(pid)
            if name is None:
                self._named.pop(pid, None)
            elif self._named.get(pid, (None,))[0] != name:
                who = program_and_user(pid)
                if who is not None:
                    self._named[pid] = (name, who)
        return {p: self._named[p][1] for p in pids if p in self._named}

    def read(self, pci: str) -> Reading:
        """One driver read of ``pci``, kept as its last read."""
        r = self.driver.read(pci)
        self.last_reads[pci] = r
        return r

    def read_all(self) -> tuple[dict[str, CardRead], list[str]]:
        """Read every card: ``({pci: CardRead}, [ids of leases whose holder died])``."""
        led = self.ledger
        leases = list(led.leases.values())
        readings = {pci: self.read(pci) for pci in led.cards}
        # Of each lease's process tree only the processes on a card and those it was seen with
        # decide anything (_map): those are asked about, not whole trees walked.
        on_cards = set().union(*(r.processes for r in readings.values()))
        anc = Ancestry()
        trees: dict[str, set[int]] = {}
        dead: list[str] = []
        for le in leases:
            # A death is news once: a released share then only waits for the driver's read.
            ending = le.is_waiting() or any(sh.state in LIVE_STATES for sh in le.shares.values())
            asked = on_cards.union(*self.lease_pids.get(le.id, {}).values())
            if le.pid is not None:
                if le.start_time is not None and not self._live.alive(
                        ProcessId(le.pid, le.start_time)):
                    if ending:
                        dead.append(le.id)
                    trees[le.id] = set()
                else:
                    trees[le.id] = anc.within(asked, le.pid)
            elif le.owner_pid is not None and le.owner_start_time is not None \
                    and not self._live.alive(ProcessId(le.owner_pid, le.owner_start_time)) \
                    and ending:
                dead.append(le.id)
            if le.reaper:
                # Every descendant of the owner but itself is the engine's, from its first
                # byte, before the engine attaches and after it double-forks out of the
                # engine's tree (issue 36).
                trees[le.id] = trees.get(le.id, set()) | self._reaped(le, anc, asked)
        self._live.sweep()
        reads = {pci: self._map(pci, r, leases, trees) for pci, r in readings.items()}
        return reads, dead

    def _reaped(self, le: Lease, anc: Ancestry, asked: set[int]) -> set[int]:
        """Those of ``asked`` below ``le``'s owner (not the owner), while the owner lives (a
        reaper's)."""
        if le.owner_pid is None or le.owner_start_time is None \
                or not self._live.alive(ProcessId(le.owner_pid, le.owner_start_time)):
            return set()
        return anc.within(asked, le.owner_pid) - {le.owner_pid}

    def _map(self, pci: str, r: Reading, leases: list[Lease],
             trees: dict[str, set[int]]) -> CardRead:
        owner: dict[int, str] = {}
        for lid, pids in trees.items():
            seen = self.lease_pids.setdefault(lid, {}).setdefault(pci, set())
            out: dict[int, int] = {}
            for pid in r.processes:
                if pid in pids or pid in seen:
                    owner[pid] = lid
                    seen.add(pid)
                    if pid not in pids and r.processes[pid]:
                        out[pid] = r.processes[pid]
            seen &= set(r.processes) | pids
            if out:
                self.escapees.setdefault(lid, {})[pci] = out
            elif lid in self.escapees:
                self.escapees[lid].pop(pci, None)
        used: dict[str, int | None] = {}
        for le in leases:
            if pci not in le.shares:
                continue
            if not r.processes_known:
                used[le.id] = None
                continue
            total = 0
            for pid, lid in owner.items():
                if lid == le.id:
                    b = r.processes[pid]
                    if b is None:
                        total = None
                        break
                    total += b
            used[le.id] = total if le.pid is not None else None
        base = self.baseline_pids.get(pci, set())
        # A waiting lease's process (adopted by a host plugin before its grant) holds
        # memory nothing granted: it counts as a stowaway until the grant (ledger.available).
        waiting = {le.id for le in leases if le.is_waiting()}
        stowaways = {pid: b or 0 for pid, b in r.processes.items()
                     if (pid not in owner or owner[pid] in waiting) and pid not in base}
        held = {p: b for p, b in stowaways.items() if b}
        return CardRead(free_bytes=r.free_bytes, stowaway_bytes=sum(stowaways.values()),
                        stowaways=held, stowaway_who=self._who(held), used=used,
                        total_bytes=r.total_bytes)

    def read_if_asked(self, sched, fx: list[Effect], clock) -> list[Effect]:
        """The scheduler grants only on a driver read taken in the step that grants (rule 1;
        issue 12 case 1): when ``fx`` asks for one (:class:`ReadCards`), read every card now,
        inside the single writer, and let ``sched`` decide on that read. Returns the effects
        without the requests."""
        for _ in range(2):
            if not any(isinstance(e, ReadCards) for e in fx):
                break
            fx = [e for e in fx if not isinstance(e, ReadCards)] + self.observe_now(sched, clock())
        return [e for e in fx if not isinstance(e, ReadCards)]

    def observe_now(self, sched, now: float) -> list[Effect]:
        """Read every card and feed it to ``sched`` (``observe``, then ``exited`` for each
        holder found dead). Called inside the single writer, so nothing changes between the
        read and the decisions made on it (rule 1; STYLE.md: a read that gates a mutation is
        taken inside the writer). A failed read is logged and changes nothing."""
        try:
            reads, dead = self.read_all()
        except DriverError as e:
            log.error("driver read failed: %s", e)
            return []
        fx = sched.observe(reads, now)
        for lid in dead:
            if lid in sched.ledger.leases:
                fx += sched.exited(lid, now)
        return fx

    def confirmation(self, lease: Lease, w: Watch) -> tuple[set[int], PidsGone | UseAtMost]:
        """What the driver confirmation of ``w`` watches for ``lease``: the pids (those seen
        as its own, and its holder's tree as on the last read) and the event to confirm, which
        expects at least 3/4 of the bytes that should leave to show in the card's free bytes."""
        pci = w.pci
        pids = set(self.lease_pids.get(lease.id, {}).get(pci, set()))
        if lease.pid is not None:
            # The lease's own process always: an engine that allocated after the last read
            # (a drain right after its start) is still watched until the driver drops it,
            # where an empty set would count as gone at once (rule 1).
            pids |= {lease.pid} | tree_pids(lease.pid) & set(self.last_reads.get(pci, Reading(
                pci, 0, 0, 0)).processes)
        sh = lease.shares[pci]
        last = self.last_reads.get(pci)
        free_before = last.free_bytes if last is not None else None
        if w.until is Until.FREED:
            return pids, PidsGone(frozenset(pids), expect_bytes=int(0.75 * max(0, (sh.used_bytes or 0))),
                                  free_before=free_before)
        expect = max(0, (sh.used_bytes or sh.reserved_bytes) - w.max_use_bytes)
        return pids, UseAtMost(frozenset(pids), w.max_use_bytes, expect_bytes=int(0.75 * expect),
                               free_before=free_before)

    def tree_use(self, pid: int) -> dict[str, int | None]:
        """Bytes the process tree of ``pid`` holds on each card now, by a driver read
        ({pci: bytes}; ``None`` where the driver cannot say per process). Used to adopt a
        process that a host started before its lease (issue 7). Raises :class:`DriverError`."""
        tree = tree_pids(pid)
        out: dict[str, int | None] = {}
        for pci in self.ledger.cards:
            r = self.driver.read(pci)
            out[pci] = r.use_of(tree & set(r.processes)) if r.processes_known else None
        return out

    def unbaseline(self, lease: Lease) -> list[Effect]:
        """A lease that adopts a process berthd measured into a card's baseline at start (it ran
        before berthd: a ``berth run`` that failed open) owns those bytes now: they leave the
        baseline, or the lease would never fit beside its own engine."""
        if lease.pid is None:
            return []
        tree = tree_pids(lease.pid)
        fx: list[Effect] = []
        for pci in lease.shares:
            base, r = self.baseline_pids.get(pci), self.last_reads.get(pci)
            mine = (base & tree) if base and r is not None else set()
            if not mine:
                continue
            n = sum(r.processes.get(pid) or 0 for pid in mine)
            card = self.ledger.cards[pci]
            card.baseline_bytes = max(0, card.baseline_bytes - n)
            base -= mine
            fx.append(Note(lease.id, "baseline", f"{lease.engine}: {format_size(n)} of pid "
                           f"{lease.pid} leave {card.name}'s baseline (measured before its lease)"))
        return fx
