"""berthd's single writer: events in, the pure scheduler decides, effects carried out.

Source: seed 002 (rules 1, 4, 5), issue 4 "The broker loop"; STYLE.md "one run loop owns the
state; slow work runs elsewhere and comes back as an event".

- One task (:meth:`Broker._loop`) owns the :class:`~berth.decide.scheduler.Scheduler`. Everything that
  changes lease state is a callable ``now -> effects`` submitted with :meth:`Broker.submit`.
- A reader task reads the driver every ``read_interval`` and at once after every event, maps each
  card's processes to leases (by process tree), counts stowaways, notices dead holders, and
  submits ``observe``/``exited``/``tick``.
- Effects: ``Granted`` wakes the run waiting for its grant; ``Instruct`` goes to the run holding
  the lease over its instruction stream (kept until reported, re-sent on reconnect); ``Watch``
  starts the driver confirmation helper, whose result comes back as ``confirmed``; ``Note``
  goes to the timeline and the log.
- The state file is rewritten atomically after every event that changed something (rule 5).
- berthd never signals a process (rule 6): a drain is an instruction to the run that started
  the engine, or to the host that manages it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from berth.daemon import store
from berth.config import Config
from berth.driver.base import Driver, DriverError, PidsGone, Reading, UseAtMost, confirm
from berth.decide.model import LIVE_STATES, Capabilities, Card, Lease, Op, ParkMechanism, Share, ShareState
from berth.process import ProcessId, alive, tree_pids
from berth.decide.admission import WaitKind
from berth.decide.effects import (CardRead, Effect, Ended, Granted, Instruct, Note, Rejected, Until,
                                  Watch)
from berth.decide.scheduler import Scheduler

__all__ = ["Broker", "LeaseGone", "Channel"]

log = logging.getLogger("berth.daemon.broker")
S = ShareState


class LeaseGone(Exception):
    """The lease ended or was rejected; ``reason`` says why."""

    def __init__(self, lease_id: str, reason: str):
        super().__init__(f"lease {lease_id}: {reason}")
        self.lease_id, self.reason = lease_id, reason


@dataclass
class Channel:
    """What berthd keeps per lease for the process that holds it: the grant future, the
    instructions not yet reported on, and a condition streams wait on."""

    grant: asyncio.Future
    pending: list[Instruct] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    ended: str | None = None
    version: int = 0


class Broker:
    """The broker as a service. ``clock`` is monotonic seconds (shared by every process on the
    machine, so state-file times stay valid across a restart)."""

    def __init__(self, cfg: Config, driver: Driver, state_path: Path, pm=None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.driver = driver
        self.state_path = Path(state_path)
        self.pm = pm
        self.clock = clock
        # Instruction numbers must keep growing across restarts: a run that polled the old
        # berthd asks the new one for what came after the last number it saw.
        self.sched = Scheduler(cfg.policy.policy(), first_seq=int(time.time() * 1000))
        self.channels: dict[str, Channel] = {}
        self.timeline: collections.deque[dict] = collections.deque(maxlen=2000)
        self.uuids: dict[str, str] = {}
        self.lease_pids: dict[str, dict[str, set[int]]] = {}   # lease -> pci -> pids seen
        self.baseline_pids: dict[str, set[int]] = {}
        self.unknown_use: dict[str, bool] = {}
        self.last_reads: dict[str, Reading] = {}
        self.started_at = clock()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._watches: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._note_seq = itertools.count(1)
        self._timeline_cond = asyncio.Condition()
        self.restored: list[str] = []
        self.dropped: list[str] = []
        self.quarantined: Path | None = None
        self.sim_dir: str | None = None
        self.closing = False
        self._carry_out_later: list[Effect] = []
        self.engines: dict[str, str] = {}     # lease id -> engine name, ended leases too

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the cards, restore the state file, measure baselines, start the tasks.
        Raises :class:`DriverError` if the driver cannot be read."""
        led = self.sched.ledger
        infos = self.driver.cards()
        snap = self._load_state()
        for i, info in enumerate(infos):
            name = self._card_name(info, i)
            cc = self.cfg.card_config(info.pci, name)
            card = Card(info.pci, cc.name or name, info.total_bytes, reserve_bytes=cc.reserve,
                        claims=dict(cc.claims), uuid=info.uuid)
            led.add_card(card)
            self.uuids[info.pci] = info.uuid
        self._restore(snap)
        now = self.clock()
        for pci, card in led.cards.items():
            r = self.driver.read(pci)
            self.last_reads[pci] = r
            cc = self.cfg.card_config(pci, card.name)
            if cc.baseline is not None:
                card.baseline_bytes = cc.baseline
            elif snap is not None and pci in snap.baselines and self.restored:
                card.baseline_bytes = snap.baselines[pci]
            else:
                # Measured with no leases: everything on the card now is the baseline.
                card.baseline_bytes = max(0, r.total_bytes - r.free_bytes)
                self.baseline_pids[pci] = set(r.processes)
            card.free_bytes, card.read_at = r.free_bytes, now
        self._tasks = [asyncio.create_task(self._loop(), name="berth-broker"),
                       asyncio.create_task(self._reader(), name="berth-reader")]
        self._persist()

    def begin_shutdown(self) -> None:
        """End every long poll now (instructions, grants, the timeline), so the API can close
        without waiting out the polls' own timeouts; the runs poll again and find the next
        berthd."""
        self.closing = True
        for ch in self.channels.values():
            self._changed(ch)
            if not ch.grant.done():
                ch.grant.cancel()

        async def notify():
            async with self._timeline_cond:
                self._timeline_cond.notify_all()
        asyncio.get_running_loop().create_task(notify())

    async def stop(self) -> None:
        for t in [*self._tasks, *self._watches]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._watches, return_exceptions=True)
        self._tasks.clear()
        self._persist()

    def _card_name(self, info, i: int) -> str:
        for c in self.cfg.driver.cards:
            if c.pci == info.pci:
                return c.name
        return f"gpu{i}"

    # -- the single writer -------------------------------------------------------------------
    async def submit(self, fn: Callable[[float], list[Effect]]):
        """Run ``fn(now)`` inside the single writer and carry out its effects. Returns the
        effects; re-raises what ``fn`` raised (the scheduler changes nothing when it raises)."""
        fut = asyncio.get_running_loop().create_future()
        await self._inbox.put((fn, fut))
        return await fut

    async def _loop(self) -> None:
        while True:
            fn, fut = await self._inbox.get()
            try:
                fx = fn(self.clock())
            except Exception as e:          # refused: nothing changed
                if not fut.done():
                    fut.set_exception(e)
                continue
            try:
                self._carry_out(fx)
                if fx:
                    # A note alone may mark a change the state file must keep (an attach's
                    # pid, ready, hold), or a restart would lose it (rule 5).
                    self._persist()
                if any(not isinstance(e, Note) for e in fx):
                    self._kick.set()
            except Exception:               # an effect failed: log it, keep serving
                log.exception("carrying out effects failed")
            if not fut.done():
                fut.set_result(fx)

    def _carry_out(self, fx: list[Effect]) -> None:
        for e in fx:
            if isinstance(e, Note):
                self._note(e)
            elif isinstance(e, Granted):
                ch = self.channels.get(e.lease_id)
                if ch and not ch.grant.done():
                    ch.grant.set_result(e)
            elif isinstance(e, Instruct):
                ch = self.channels.setdefault(e.lease_id, self._channel())
                if e.op is Op.DRAIN:
                    ch.pending = [i for i in ch.pending if i.op is Op.DRAIN]
                ch.pending.append(e)
                self._changed(ch)
            elif isinstance(e, Watch):
                t = asyncio.create_task(self._watch(e))
                self._watches.add(t)
                t.add_done_callback(self._watches.discard)
            elif isinstance(e, Rejected):
                ch = self.channels.get(e.lease_id)
                if ch is not None:
                    ch.ended = f"rejected: {e.reason}"
                    if not ch.grant.done():
                        ch.grant.set_exception(LeaseGone(e.lease_id, ch.ended))
                self._note(Note(e.lease_id, "rejected", e.reason))
            elif isinstance(e, Ended):
                ch = self.channels.get(e.lease_id)
                if ch is not None:
                    ch.ended = ch.ended or e.reason
                    if not ch.grant.done():
                        ch.grant.set_exception(LeaseGone(e.lease_id, e.reason))
                    self._changed(ch)
                self.lease_pids.pop(e.lease_id, None)

    def _channel(self) -> Channel:
        return Channel(grant=asyncio.get_running_loop().create_future())

    def _changed(self, ch: Channel) -> None:
        ch.version += 1

        async def notify():
            async with ch.changed:
                ch.changed.notify_all()
        asyncio.get_running_loop().create_task(notify())

    def _note(self, e: Note) -> None:
        now = self.clock()
        entry = {"seq": next(self._note_seq), "t": round(now - self.started_at, 3), "at": now,
                 "lease": e.lease_id, "engine": self.engines.get(e.lease_id),
                 "kind": e.kind, "text": e.text, **({"data": e.data} if e.data else {})}
        self.timeline.append(entry)
        log.info("%s %s", e.kind, e.text)

        async def notify():
            async with self._timeline_cond:
                self._timeline_cond.notify_all()
        asyncio.get_running_loop().create_task(notify())

    async def wait_timeline(self, after_seq: int, timeout_s: float) -> list[dict]:
        """Timeline entries with ``seq > after_seq``, waiting up to ``timeout_s`` for one."""
        def newer():
            return [x for x in self.timeline if x["seq"] > after_seq]
        async with self._timeline_cond:
            try:
                await asyncio.wait_for(self._timeline_cond.wait_for(
                    lambda: bool(newer()) or self.closing), timeout_s)
            except TimeoutError:
                pass
        return newer()

    # -- requests from the API ---------------------------------------------------------------
    def new_lease_id(self, engine: str) -> str:
        """A lease id safe in a URL path: the engine's name with anything but letters, digits,
        ``.``, ``_`` and ``-`` replaced by ``-``, then a time stamp and a counter."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "-", engine)[:60] or "engine"
        while True:
            lid = f"{safe}-{int(time.time()) % 100000:05d}-{next(self._ids)}"
            if lid not in self.sched.ledger.leases:
                return lid

    async def request(self, lease: Lease) -> list[Effect]:
        self.channels[lease.id] = self._channel()
        self.engines[lease.id] = lease.engine
        try:
            return await self.submit(lambda now: self._unbaseline(lease)
                                     + self.sched.request(lease, now))
        except Exception:
            self.channels.pop(lease.id, None)
            raise

    def _unbaseline(self, lease: Lease) -> list[Effect]:
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
            card = self.sched.ledger.cards[pci]
            card.baseline_bytes = max(0, card.baseline_bytes - n)
            base -= mine
            fx.append(Note(lease.id, "baseline", f"{lease.engine}: {n} bytes of pid "
                           f"{lease.pid} leave {card.name}'s baseline (measured before its lease)"))
        return fx

    async def wait_grant(self, lease_id: str, timeout_s: float) -> Granted | None:
        """The grant, or ``None`` after ``timeout_s``. Raises :class:`LeaseGone` or ``KeyError``."""
        ch = self.channels.get(lease_id)
        if ch is None:
            raise KeyError(f"lease {lease_id!r}: not known")
        lease = self.sched.ledger.leases.get(lease_id)
        if lease is not None and not lease.is_waiting() and not ch.grant.done():
            ch.grant.set_result(Granted(lease_id, {p: s.reserved_bytes
                                                   for p, s in lease.shares.items()}))
        try:
            return await asyncio.wait_for(asyncio.shield(ch.grant), timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            if ch.grant.cancelled() and not self.closing:
                ch.grant = asyncio.get_running_loop().create_future()
            if asyncio.current_task().cancelling():
                raise
            return None

    async def instructions(self, lease_id: str, after_seq: int, timeout_s: float):
        """Instructions with ``seq > after_seq`` not yet reported, waiting up to
        ``timeout_s`` for one. Returns ``(instructions, ended_reason_or_None)``."""
        ch = self.channels.get(lease_id)
        if ch is None:
            raise KeyError(f"lease {lease_id!r}: not known")

        def ready():
            return [i for i in ch.pending if i.seq > after_seq]
        async with ch.changed:
            if not ready() and ch.ended is None and not self.closing:
                try:
                    await asyncio.wait_for(ch.changed.wait_for(
                        lambda: bool(ready()) or ch.ended is not None or self.closing),
                        timeout_s)
                except TimeoutError:
                    pass
        return ready(), ch.ended

    def reported(self, lease_id: str, op: str) -> None:
        ch = self.channels.get(lease_id)
        if ch is not None:
            ch.pending = [i for i in ch.pending if i.op != op]

    # -- driver reads --------------------------------------------------------------------------
    async def _reader(self) -> None:
        interval = self.cfg.policy.read_interval
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), interval)
            except TimeoutError:
                pass
            self._kick.clear()
            try:
                reads, dead = self._read_all()
            except DriverError as e:
                log.error("driver read failed: %s", e)
                continue
            except Exception:
                log.exception("driver read failed")
                continue

            def apply(now, reads=reads, dead=dead):
                fx = self.sched.observe(reads, now)
                for lid in dead:
                    if lid in self.sched.ledger.leases:
                        fx += self.sched.exited(lid, now)
                return fx + self.sched.tick(now)
            try:
                await self.submit(apply)
            except Exception:
                log.exception("applying a driver read failed")

    def _read_all(self) -> tuple[dict[str, CardRead], list[str]]:
        led = self.sched.ledger
        leases = list(led.leases.values())
        trees: dict[str, set[int]] = {}
        dead: list[str] = []
        for le in leases:
            # A death is news once: a released share then only waits for the driver's read.
            ending = le.is_waiting() or any(sh.state in LIVE_STATES for sh in le.shares.values())
            if le.pid is not None:
                if le.start_time is not None and not alive(ProcessId(le.pid, le.start_time)):
                    if ending:
                        dead.append(le.id)
                    trees[le.id] = set()
                else:
                    trees[le.id] = tree_pids(le.pid)
            elif le.owner_pid is not None and le.owner_start_time is not None \
                    and not alive(ProcessId(le.owner_pid, le.owner_start_time)) and ending:
                dead.append(le.id)
        reads: dict[str, CardRead] = {}
        for pci in led.cards:
            r = self.driver.read(pci)
            self.last_reads[pci] = r
            owner: dict[int, str] = {}
            for lid, pids in trees.items():
                seen = self.lease_pids.setdefault(lid, {}).setdefault(pci, set())
                for pid in r.processes:
                    if pid in pids or pid in seen:
                        owner[pid] = lid
                        seen.add(pid)
                seen &= set(r.processes) | pids
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
            stow = sum(b or 0 for pid, b in r.processes.items()
                       if (pid not in owner or owner[pid] in waiting) and pid not in base)
            reads[pci] = CardRead(free_bytes=r.free_bytes, stowaway_bytes=stow, used=used,
                                  total_bytes=r.total_bytes)
        return reads, dead

    async def _watch(self, w: Watch) -> None:
        """Run the confirmation helper for one watch; report back with ``confirmed``."""
        while True:
            lease = self.sched.ledger.leases.get(w.lease_id)
            if lease is None:
                return
            pids = set(self.lease_pids.get(w.lease_id, {}).get(w.pci, set()))
            if lease.pid is not None:
                pids |= tree_pids(lease.pid) & set(self.last_reads.get(w.pci, Reading(
                    w.pci, 0, 0, 0)).processes)
            card = self.sched.ledger.cards[w.pci]
            sh = lease.shares[w.pci]
            free_before = self.last_reads[w.pci].free_bytes if w.pci in self.last_reads else None
            if w.until is Until.FREED:
                ev = PidsGone(frozenset(pids), expect_bytes=int(0.75 * max(0, (sh.used_bytes or 0))),
                              free_before=free_before)
            else:
                expect = max(0, (sh.used_bytes or sh.reserved_bytes) - w.max_use_bytes)
                ev = UseAtMost(frozenset(pids), w.max_use_bytes, expect_bytes=int(0.75 * expect),
                               free_before=free_before)
            deadline = max(w.deadline, self.clock() + 0.5)
            try:
                r = await confirm(self.driver, w.pci, ev, deadline, clock=self.clock,
                                  event_at=w.since)
            except DriverError as e:
                log.error("confirmation read of %s failed: %s", card.name, e)
                r = None
            if r is not None:
                use = r.use_of(pids) if r.processes_known else None
                cr = self._card_read(w.pci, r)

                def apply(now, cr=cr, use=use):
                    return self.sched.observe({w.pci: cr}, now) + self.sched.confirmed(
                        w.lease_id, w.pci, w.until, now, use_bytes=use)
                await self.submit(apply)
                return
            if w.until is not Until.FREED:
                return           # the scheduler's deadline falls back to a drain
            # A drain has no fallback: keep watching until the memory is free.
            w = Watch(w.lease_id, w.pci, w.until, w.max_use_bytes, w.since,
                      self.clock() + self.cfg.policy.release_grace)

    def tree_use(self, pid: int) -> dict[str, int | None]:
        """Bytes the process tree of ``pid`` holds on each card now, by a driver read
        ({pci: bytes}; ``None`` where the driver cannot say per process). Used to adopt a
        process that a host started before its lease (issue 7). Raises :class:`DriverError`."""
        tree = tree_pids(pid)
        out: dict[str, int | None] = {}
        for pci in self.sched.ledger.cards:
            r = self.driver.read(pci)
            out[pci] = r.use_of(tree & set(r.processes)) if r.processes_known else None
        return out

    def _orphans(self, lease: Lease) -> dict:
        """Board fields for a lease whose main process is gone while processes it started still
        hold memory on its cards (issue 7; reference/hosts.md "Orphans"): ``orphans`` lists
        ``{"pid", "card", "bytes"}`` and ``note`` says what to change. Berth never signals them
        (rule 6). Empty when there are none."""
        if lease.pid is None or lease.start_time is None or alive(
                ProcessId(lease.pid, lease.start_time)):
            return {}
        found = []
        for pci, pids in self.lease_pids.get(lease.id, {}).items():
            r = self.last_reads.get(pci)
            for pid in sorted(pids):
                if r is not None and pid in r.processes and pid != lease.pid:
                    found.append({"pid": pid, "card": pci, "bytes": r.processes[pid]})
        if not found:
            return {}
        held = sum(o["bytes"] or 0 for o in found)
        entry = self.cfg.engines.get(lease.engine)
        if entry is not None and entry.supervisor:
            advice = (f"supervisord signals only a program's main process: set stopasgroup=true "
                      f"and killasgroup=true in [program:{entry.supervisor}]")
        else:
            advice = "stop them: Berth does not signal processes it did not start (rule 6)"
        return {"orphans": found,
                "note": f"main process {lease.pid} is gone but {len(found)} process(es) it "
                        f"started still hold {held} bytes (pids "
                        f"{', '.join(str(o['pid']) for o in found)}); {advice}"}

    def _card_read(self, pci: str, r: Reading) -> CardRead:
        card = self.sched.ledger.cards[pci]
        return CardRead(free_bytes=r.free_bytes, stowaway_bytes=card.stowaway_bytes,
                        total_bytes=r.total_bytes)

    # -- the state file ------------------------------------------------------------------------
    def _snapshot(self) -> store.Snapshot:
        led = self.sched.ledger
        return store.Snapshot(
            leases=list(led.leases.values()),
            waiting=[(w.lease_id, w.kind.value, w.since) for w in self.sched.queue],
            counters=self.sched.counters.as_dict(),
            baselines={p: c.baseline_bytes for p, c in led.cards.items()},
            boot_id=store.boot_id())

    def _persist(self) -> None:
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            store.write_atomic(self.state_path, store.dump(self._snapshot()))
        except OSError:
            log.exception("writing the state file %s failed", self.state_path)

    def _load_state(self) -> store.Snapshot | None:
        try:
            snap = store.load(self.state_path)
        except store.StateCorrupt as e:
            self.quarantined = store.quarantine(self.state_path)
            log.error("%s. Moved it aside to %s and starting empty; processes that still hold "
                      "memory will show as stowaways.", e, self.quarantined)
            return None
        if snap is not None and snap.boot_id and snap.boot_id != store.boot_id():
            log.warning("the state file was written before a reboot; no lease survives it")
            self.dropped = [le.id for le in snap.leases]
            snap.leases, snap.waiting = [], []
        return snap

    def _restore(self, snap: store.Snapshot | None) -> None:
        """Re-attach every lease whose process still matches, with each card's measured use
        by its processes (the scheduler's :meth:`~berth.decide.scheduler.Scheduler.adopt`
        settles shares caught mid-transition by it, issue 4)."""
        if snap is None:
            return
        for k, v in snap.counters.items():
            if hasattr(self.sched.counters, k):
                setattr(self.sched.counters, k, v)
        waiting = {lid: (kind, since) for lid, kind, since in snap.waiting}
        led = self.sched.ledger
        now = self.clock()
        reads = {pci: self.driver.read(pci) for pci in led.cards}
        fx: list[Effect] = []
        for lease in snap.leases:
            if not self._still_alive(lease) or any(p not in led.cards for p in lease.shares):
                self.dropped.append(lease.id)
                continue
            tree = tree_pids(lease.pid) if lease.pid else set()
            use = {pci: reads[pci].use_of(tree & set(reads[pci].processes))
                   if reads[pci].processes_known else None for pci in lease.shares}
            kind, since = waiting.get(lease.id, (None, None))
            if lease.is_waiting() and kind is None:
                kind, since = "grant", lease.requested_at
            self.channels[lease.id] = self._channel()
            self.engines[lease.id] = lease.engine
            fx += self.sched.adopt(lease, now, kind, since, use)
            self.restored.append(lease.id)
        self._carry_out_later = fx

    def _still_alive(self, lease: Lease) -> bool:
        if lease.pid is not None and lease.start_time is not None:
            return alive(ProcessId(lease.pid, lease.start_time))
        if lease.owner_pid is not None and lease.owner_start_time is not None:
            return alive(ProcessId(lease.owner_pid, lease.owner_start_time))
        return False

    async def resume_restored(self) -> None:
        """Carry out what re-attaching asked for (re-sent instructions, watches)."""
        fx, self._carry_out_later = self._carry_out_later, []
        if fx:
            await self.submit(lambda now: fx)

    # -- the board -----------------------------------------------------------------------------
    def status(self) -> dict:
        """The board as DESIGN.md's ``berth status --json`` keys (bytes, seconds)."""
        from berth.decide.measures import reserve_fraction, suggested_reserve
        led = self.sched.ledger
        sugg = suggested_reserve(led, self.sched.growth, self.cfg.policy.read_interval)
        cards = []
        for pci, c in led.cards.items():
            v = led.view(pci)
            shares = [{"lease": le.id, "engine": le.engine, "state": sh.state.value,
                       "counted_bytes": _counted(sh), "held": le.held,
                       "over_bytes": max(0, (sh.used_bytes or 0) - sh.reserved_bytes)
                       if sh.state is S.ACTIVE else 0}
                      for le, sh in led.shares_on(pci) if sh.state not in (S.WAITING, S.FREED)]
            cards.append({"pci": pci, "name": c.name, "uuid": c.uuid,
                          "total_bytes": c.total_bytes, "reserve_bytes": c.reserve_bytes,
                          "baseline_bytes": c.baseline_bytes, "stowaway_bytes": c.stowaway_bytes,
                          "claim_bytes": c.claim_bytes, "claims": dict(c.claims),
                          "free_bytes": c.free_bytes, "budget_bytes": v.budget_bytes,
                          "available_bytes": v.available_bytes, "counted_bytes": v.counted_bytes,
                          "earmarked_bytes": v.earmarked_bytes,
                          "suggested_reserve_bytes": sugg[pci]["suggested_bytes"],
                          "reserve_below_suggested": sugg[pci]["below"], "shares": shares})
        leases = []
        for le in led.leases.values():
            extra = self._orphans(le)
            leases.append({**extra,
                "id": le.id, "engine": le.engine, "pid": le.pid, "start_time": le.start_time,
                "priority": le.priority, "bound": le.bound.value, "held": le.held,
                "ready": le.ready_at is not None,
                "capabilities": le.caps.as_dict(),
                "shares": [{"card": sh.card, "card_name": led.cards[sh.card].name,
                            "size_bytes": sh.size_bytes, "state": sh.state.value,
                            "reserved_bytes": sh.reserved_bytes, "used_bytes": sh.used_bytes,
                            "lent_bytes": sh.lent_bytes, "residual_bytes": sh.residual_bytes,
                            "lent_to": sh.lent_to, "borrowed_from": sh.borrowed_from}
                           for sh in le.shares.values()]})
        now = self.clock()
        waiting = [{"id": w.lease_id, "engine": led.leases[w.lease_id].engine, "kind": w.kind.value,
                    "need": [{"card": p, "card_name": led.cards[p].name, "size_bytes": b}
                             for p, b in w.need.items()],
                    "since": w.since, "waited_s": round(now - w.since, 3), "skips": w.skips,
                    "why": self.sched.why_waiting(w.lease_id),
                    **_running_unleased(led.leases[w.lease_id], w.kind.value)}
                   for w in self.sched.queue]
        counters = self.sched.counters.as_dict()
        counters["reserve_fraction"] = round(reserve_fraction(led), 4)
        ram = {"budget_bytes": led.ram_budget_bytes, "parked_bytes": led.parked_in_ram_bytes(),
               "available_bytes": led.ram_available_bytes()}
        return {"cards": cards, "leases": leases, "waiting": waiting, "counters": counters,
                "host_ram": ram, "driver": self.driver.kind,
                "uptime_s": round(now - self.started_at, 1)}


def _running_unleased(lease: Lease, kind: str) -> dict:
    """Board fields for a waiter whose process already runs (a host started it before its
    grant, issue 7): it holds memory without a grant, so it is over budget until room is made."""
    if kind != WaitKind.GRANT or lease.pid is None:
        return {}
    held = sum(sh.used_bytes or 0 for sh in lease.shares.values())
    return {"pid": lease.pid, "running": True, "held_bytes": held,
            "note": f"over budget: pid {lease.pid} already runs and holds {held} bytes without a "
                    f"grant; they count as stowaways until room is made"}


def _counted(sh: Share) -> int:
    from berth.decide.ledger import counted_bytes
    return counted_bytes(sh)


def caps_from(park: str | None, lend: bool, lend_max: int | None, front: str | None) -> Capabilities:
    return Capabilities(park=ParkMechanism(park) if park else None, lend=lend,
                        lend_max_bytes=lend_max, front=front)
