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

Its helpers, each a job of its own: :mod:`.reads` (driver reads mapped to leases),
:mod:`.channels` (per-lease grant and instructions, the timeline), :mod:`.restore` (the state
file written and taken back; the settling of restarted shares is the scheduler's ``adopt``),
:mod:`.status` (the board), :mod:`.read_loops` (the reader task and the watches'
confirmation, a mixin).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

from berth.config import Config
from berth.daemon import restore, status
from berth.daemon.channels import Channel, HostNotes, LeaseGone, Timeline, set_waits
from berth.daemon.costs import SwitchCosts
from berth.daemon.read_loops import ReadLoops
from berth.daemon.reads import Reads
from berth.decide.effects import Effect, Ended, Granted, Instruct, Note, Rejected, Watch
from berth.decide.model import Card, Lease
from berth.decide.placement import Ask
from berth.decide.scheduler import Scheduler
from berth.driver.base import Driver

__all__ = ["Broker", "LeaseGone", "Channel"]

log = logging.getLogger("berth.daemon.broker")


#: Seconds between two tries of a state write that failed (a full disk, EIO).
PERSIST_RETRY_S = 2.0


class Broker(ReadLoops):
    """The broker as a service. ``clock`` is monotonic seconds (shared by every process on the
    machine, so state-file times stay valid across a restart)."""

    def __init__(self, cfg: Config, driver: Driver, state_path: Path, pm=None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.driver = driver
        self.state_path = Path(state_path)
        self._persist_error: str | None = None   # the last failed write's, said once
        self._retrying: asyncio.Task | None = None  # tries the write again while it fails
        self.pm = pm
        self.clock = clock
        # Instruction numbers must keep growing across restarts: a run that polled the old
        # berthd asks the new one for what came after the last number it saw.
        self.sched = Scheduler(cfg.policy.policy(), first_seq=int(time.time() * 1000))
        self.reads = Reads(driver, self.sched.ledger)
        # The API reads these two of the reader's maps (lease pids; the last read per card).
        self.lease_pids = self.reads.lease_pids
        self.channels: dict[str, Channel] = {}
        self.timeline, self.host_notes = Timeline(), HostNotes()
        self.costs = SwitchCosts()              # measured park / restore / cold start (issue 14)
        self.uuids: dict[str, str] = {}
        self.started_at = clock()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._watches: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
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
        loaded = restore.load(self.state_path)
        snap, self.quarantined, self.dropped = loaded.snap, loaded.quarantined, loaded.dropped
        for i, info in enumerate(infos):
            name = self._card_name(info, i)
            cc = self.cfg.card_config(info.pci, name)
            card = Card(info.pci, cc.name or name, info.total_bytes, reserve_bytes=cc.reserve,
                        claims=dict(cc.claims), uuid=info.uuid)
            led.add_card(card)
            self.uuids[info.pci] = info.uuid
        adopted, dropped, self._carry_out_later = restore.restore(snap, self.sched, self.driver,
                                                                  self.clock())
        self.dropped += dropped
        for lease in adopted:
            self.channels[lease.id] = Channel.new()
            self.engines[lease.id] = lease.engine
            self.restored.append(lease.id)
        now = self.clock()
        for pci, card in led.cards.items():
            r = self.reads.read(pci)
            cc = self.cfg.card_config(pci, card.name)
            known = r.processes_known and all(b is not None for b in r.processes.values())
            if cc.baseline is not None:
                card.baseline_bytes = cc.baseline
            elif known:
                # What the card uses with no process on it (driver context, display): every
                # process is a lease's or a stowaway, whenever it came, and its bytes go when
                # it goes (issue 12 case 5).
                card.baseline_bytes = max(0, r.total_bytes - r.free_bytes
                                          - sum(b or 0 for b in r.processes.values()))
            elif snap is not None and pci in snap.baselines and self.restored:
                card.baseline_bytes = snap.baselines[pci]
            else:
                # The driver cannot say per process: all of it is the baseline until then.
                card.baseline_bytes = max(0, r.total_bytes - r.free_bytes)
                self.reads.baseline_pids[pci] = set(r.processes)
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
            ch.touch()
            if not ch.grant.done():
                ch.grant.cancel()
        self.timeline.wake_all()

    async def stop(self) -> None:
        self.closing = True                     # no new retry of the state write
        if self._retrying is not None:
            self._tasks.append(self._retrying)
        for t in [*self._tasks, *self._watches]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._watches, return_exceptions=True)
        self._tasks.clear()
        self.reads.close()
        self._persist()

    def _card_name(self, info, i: int) -> str:
        for c in self.cfg.driver.cards:
            if c.pci == info.pci:
                return c.name
        return f"gpu{i}"

    def _persist(self) -> None:
        """Write the state file. A failed write (ENOSPC, EIO) leaves the last good file, is said
        once (:func:`restore.persist`), and is tried again every :data:`PERSIST_RETRY_S` until
        it passes, change or no change: the state a restart finds is the latest that could be
        written, and up to date again as soon as there is room (issue 36)."""
        self._persist_error = restore.persist(self.state_path, self.sched, self._persist_error)
        if self._persist_error is not None and self._retrying is None and not self.closing:
            self._retrying = asyncio.get_running_loop().create_task(self._retry_persist(),
                                                                    name="berth-persist")

    async def _retry_persist(self) -> None:
        # persist() is synchronous and awaits nothing: called here it reads the one state
        # the single writer leaves between two events, as when the writer calls it.
        try:
            while self._persist_error is not None and not self.closing:
                await asyncio.sleep(PERSIST_RETRY_S)
                self._persist_error = restore.persist(self.state_path, self.sched,
                                                      self._persist_error)
        finally:
            self._retrying = None

    def _closing(self) -> bool:
        return self.closing

    async def resume_restored(self) -> None:
        """Carry out what re-attaching asked for (re-sent instructions, watches)."""
        fx, self._carry_out_later = self._carry_out_later, []
        if fx:
            await self.submit(lambda now: fx)

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
                fx = self.reads.read_if_asked(self.sched, fn(self.clock()), self.clock)
            except Exception as e:          # refused: nothing changed
                if not fut.done():
                    fut.set_exception(e)
                continue
            try:
                self._carry_out(fx)
                set_waits(self.channels, self.sched)
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
                if ch:
                    ch.grant_now(e)
            elif isinstance(e, Instruct):
                self.channels.setdefault(e.lease_id, Channel.new()).send(e)
            elif isinstance(e, Watch):
                t = asyncio.create_task(self._watch(e))
                self._watches.add(t)
                t.add_done_callback(self._watches.discard)
            elif isinstance(e, Rejected):
                ch = self.channels.get(e.lease_id)
                if ch is not None:
                    ch.reject(e.lease_id, e.reason)
                self._note(Note(e.lease_id, "rejected", e.reason))
            elif isinstance(e, Ended):
                ch = self.channels.get(e.lease_id)
                if ch is not None:
                    ch.end(e.lease_id, e.reason)
                self.reads.lease_pids.pop(e.lease_id, None)
                self.reads.escapees.pop(e.lease_id, None)

    def _note(self, e: Note) -> None:
        now = self.clock()
        self.timeline.add({"t": round(now - self.started_at, 3), "at": now,
                           "lease": e.lease_id, "engine": self.engines.get(e.lease_id),
                           "kind": e.kind, "text": e.text, **({"data": e.data} if e.data else {})})
        log.info("%s %s", e.kind, e.text)
        self.costs.note(e.lease_id, self.engines.get(e.lease_id), e.kind, now)

    async def wait_timeline(self, after_seq: int, timeout_s: float) -> list[dict]:
        """Timeline entries with ``seq > after_seq``, waiting up to ``timeout_s`` for one."""
        return await self.timeline.wait(after_seq, timeout_s, self._closing)

    # -- requests from the API ---------------------------------------------------------------
    def new_lease_id(self, engine: str) -> str:
        """A lease id safe in a URL path once percent-encoded: the engine's name with anything
        but letters and digits (any script: ``模型`` stays), ``.``, ``_`` and ``-`` replaced by
        ``-``, then a time stamp and a counter."""
        safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in engine)[:60] or "engine"
        while True:
            lid = f"{safe}-{int(time.time()) % 100000:05d}-{next(self._ids)}"
            if lid not in self.sched.ledger.leases:
                return lid

    async def request(self, lease: Lease, asks: Sequence[Ask] = (), client: str | None = None,
                      client_age_s: float | None = None) -> list[Effect]:
        """Queue a new lease. Inside the single writer, in one step: a process the lease adopts
        (``lease.pid``) is measured on every card, the shares ``asks`` names are placed
        (:meth:`Scheduler.place`) on that read and the ledger as it is then, and the scheduler
        takes the request (``client``, ``client_age_s``: the held request it asks for, as for
        :meth:`Scheduler.request`). Raises :class:`~berth.decide.placement.PlacementError`,
        :class:`DriverError`, ``ValueError`` or ``KeyError``; nothing changes then."""
        self.channels[lease.id] = Channel.new()
        self.engines[lease.id] = lease.engine

        def step(now: float) -> list[Effect]:
            held = self.reads.tree_use(lease.pid) if lease.pid is not None else {}
            self.sched.place(lease, list(asks), held)
            asked_at = None if client_age_s is None else now - client_age_s
            return self.reads.unbaseline(lease) + self.sched.request(lease, now, client, asked_at)
        try:
            return await self.submit(step)
        except Exception:
            self.channels.pop(lease.id, None)
            raise

    async def wait_grant(self, lease_id: str, timeout_s: float,
                         wait_version: int | None = None) -> Granted | None:
        """The grant, or ``None`` after ``timeout_s`` (or once the lease's wait differs from
        ``wait_version``). Raises :class:`LeaseGone` or ``KeyError``."""
        ch = self.channels.get(lease_id)
        if ch is None:
            raise KeyError(f"lease {lease_id!r}: not known")
        lease = self.sched.ledger.leases.get(lease_id)
        if lease is not None and not lease.is_waiting():
            ch.grant_now(Granted(lease_id, {p: s.reserved_bytes for p, s in lease.shares.items()}))
        return await ch.wait_grant(timeout_s, self._closing, wait_version)

    async def instructions(self, lease_id: str, after_seq: int, timeout_s: float,
                           wait_version: int | None = None):
        """Instructions with ``seq > after_seq`` not yet reported, waiting up to
        ``timeout_s`` for one. Returns ``(instructions, ended_reason_or_None)``. Raises
        ``KeyError`` for an unknown lease."""
        ch = self.channels.get(lease_id)
        if ch is None:
            raise KeyError(f"lease {lease_id!r}: not known")
        return await ch.wait_instructions(after_seq, timeout_s, self._closing, wait_version)

    def reported(self, lease_id: str, op: str) -> None:
        ch = self.channels.get(lease_id)
        if ch is not None:
            ch.reported(op)

    def tree_use(self, pid: int) -> dict[str, int | None]:
        """See :meth:`Reads.tree_use`."""
        return self.reads.tree_use(pid)

    def status(self) -> dict:
        """The board (:func:`berth.daemon.status.board`)."""
        return status.board(self)
