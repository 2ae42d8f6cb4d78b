"""Berth: the real pure core, ``berth.decide.scheduler.Scheduler``, driven in virtual time.

Every decision (admission under the lease's bound, the head-of-line policy, the making-room
ladder, minimum turns, the juggle guard, fallbacks) comes from the core; this module only plays
the parts the broker, the driver and ``berth run --front`` play around it:

- **Requests.** Each engine sits behind a front (seed 002 "Fronts"). A request with no lease asks
  for one (``request``); one for a parked or parking lease asks for a wake (``wake``); one for
  an active, ready engine is forwarded (and ``touch``-ed for the victim order). A front that is
  closing or asleep holds requests; when its engine settles parked with requests held it asks
  for the wake itself ("asleep: hold, and ask berthd for the card on the first request").
- **Effects.** ``Granted``: the run starts the engine (a cold load, seen ready by the run's own
  health probe, :mod:`berth.run.probe`: llama-swap runs Berth as its ``cmd`` with
  ``--front-health``, so its poll passes as soon as the front listens and the front holds the
  requests until the probe sees the engine answer). ``Instruct``: ``park`` checkpoints
  once forwarded requests finish and reports it done; ``wake`` restores and then reports;
  ``drain`` stops the engine and reports the exit; ``lend``/``return`` shrink and regrow the
  engine's own cap and report.
  ``Watch``: the confirmation helper of ``berth.driver.base.confirm``, polling the simulated
  driver at its cadence (:func:`next_poll`: at 0, 20, 60 ms, then every 50 ms), and calling
  ``confirmed`` with the use it read. ``Ended`` lets held requests ask for a new lease.
- **Reads.** Every ``read_interval_s`` a ``CardRead`` per card (free bytes, each lease's use)
  goes to ``observe``, so growth shows and growth-bound holders get their extensions.
- **Deadlines.** ``tick`` runs at the earliest of the scheduler's deadlines.

Scheduler calls are never nested: completions arrive as posted events, and anything that would
call back into the scheduler from inside an effect is posted too.

Knobs (:data:`KNOBS`): the core's defaults except ``release_grace_s`` = 90 s, because a park
waits for forwarded requests to finish and image jobs run up to 60 s (plus up to 2.7 s to
checkpoint 18 GiB at 7 GB/s); with the default 20 s every park of a busy ComfyUI would fall back
to a drain.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque

from berth.decide.admission import Policy as CoreKnobs
from berth.decide.admission import QueuePolicy
from berth.decide.ledger import Ledger
from berth.decide.measures import reserve_fraction
from berth.decide.model import (
    Bound,
    Capabilities,
    Card,
    Lease,
    Op,
    ParkMechanism,
    Share,
    ShareState,
)
from berth.decide.placement import Ask
from berth.decide.scheduler import (
    CardRead,
    Ended,
    Granted,
    Instruct,
    Note,
    ReadCards,
    Rejected,
    Scheduler,
    Watch,
)
from berth.driver import base
from berth.run import probe

from ..world import EXITED, GONE, LOADING, PARKED, READY
from .base import SimPolicy

__all__ = ["BerthPolicy", "KNOBS", "DEFAULT_KNOBS", "default_policy", "next_poll",
           "client_key"]

S = ShareState

#: The core's Policy knobs used by every Berth configuration (seconds, counts).
KNOBS = dict(scan_max_skips=8, scan_max_wait_s=30.0, release_grace_s=90.0, wake_limit_s=60.0,
             wait_limit_s=120.0, min_turn_s=10.0, juggle_window_s=120.0, juggle_max_swaps=4,
             read_interval_s=1.0, rent_fixed_s=-1.0, demand_trust=0.0)

def _install_defaults() -> tuple[dict, int]:
    """Berth exactly as a new install configures it: ``[policy]`` with no keys (berth.toml's
    defaults, :class:`berth.config.models.PolicyConfig`) and every card's default reserve
    (:class:`berth.config.models.CardConfig`)."""
    from dataclasses import asdict

    from berth.config.models import CardConfig, PolicyConfig
    knobs = asdict(PolicyConfig().policy())
    knobs.pop("queue")
    return knobs, CardConfig().reserve


#: The core's knobs of a new install (``[policy]`` left empty), and its per-card reserve.
DEFAULT_KNOBS, DEFAULT_RESERVE_BYTES = _install_defaults()


def default_policy(knobs: dict | None = None) -> "BerthPolicy":
    """``berth-default``: the defaults of berth.toml and ``berth run --front`` (its front
    forwards the engine's slots, measured or declared, issue 34), the engines' declared bound, the
    default reserve on every card. Only the engines' own entries (size, park, priority,
    keep_warm) come from the workload, as a user writes them."""
    from berth.config.models import PolicyConfig
    pol = BerthPolicy(str(PolicyConfig().queue), "declared", {**DEFAULT_KNOBS, **(knobs or {})},
                      reserve_bytes=DEFAULT_RESERVE_BYTES, max_in_flight="slots")
    pol.name = "berth-default"
    return pol


_SERVING = frozenset({S.ACTIVE, S.LENDING, S.LENT, S.RETURNING})
_ASLEEP = frozenset({S.PARKING, S.PARKED})


def client_key(job) -> str | None:
    """The key a front would make for ``job``'s client: its closed-loop client's index
    (``world.Job.client``), ``None`` for an open-loop request (no client known, so no
    causality to read from it; issue 34)."""
    return None if job.client is None else f"client-{job.client}"


def next_poll(since_s: float, t_s: float) -> float:
    """The first read of ``berth.driver.base.confirm`` at or after ``t_s``, for a watch opened at
    ``since_s``: at once, then at its cadence (:data:`berth.driver.base.CONFIRM_FIRST_S`,
    growing by ``CONFIRM_GROWTH`` up to ``CONFIRM_CAP_S``), the very numbers berthd polls by."""
    at, delay = since_s, base.CONFIRM_FIRST_S
    while at < t_s - 1e-12:
        if delay >= base.CONFIRM_CAP_S:
            # Past the growing phase the reads are evenly spaced: jump there in one step.
            return at + math.ceil((t_s - at) / base.CONFIRM_CAP_S - 1e-9) * base.CONFIRM_CAP_S
        at += delay
        delay = min(delay * base.CONFIRM_GROWTH, base.CONFIRM_CAP_S)
    return at


class BerthPolicy(SimPolicy):
    """One Berth configuration: a queue policy (``strict``/``scan``) and a bound
    (``declared``/``current``/``growth``), with :data:`KNOBS` unless ``knobs`` overrides them."""

    def __init__(self, queue: str, bound: str, knobs: dict | None = None, *,
                 reserve_bytes: int | None = None, max_in_flight: str | int | None = "slots"):
        self.queue, self.bound = QueuePolicy(queue), Bound(bound)
        self.knobs = {**KNOBS, **(knobs or {})}
        self.name = f"berth-{queue}-{bound}"
        # None: the workload's reserve per card; "slots": the front forwards at most the
        # engine's slots (``--max-in-flight N``); None: it forwards everything (the default).
        self.reserve_bytes, self.max_in_flight = reserve_bytes, max_in_flight
        #: the checkpoint tool restores onto another card of the same kind (cuda-checkpoint
        #: ``--device-map``, driver 580+; issue 35), as ``berth run`` detects it
        self.restore_across = True

    def attach(self, world) -> None:
        super().attach(world)
        led = Ledger(ram_budget_bytes=world.wl.host_ram_bytes)
        for c in world.wl.cards:
            led.add_card(Card(pci=c.pci, name=c.name, total_bytes=c.total_bytes,
                              reserve_bytes=c.reserve_bytes if self.reserve_bytes is None
                              else self.reserve_bytes))
        self.sched = Scheduler(CoreKnobs(queue=self.queue, **self.knobs), led)
        self.lease_of: dict[str, str] = {}
        self.engine_of: dict[str, str] = {}
        self.proc_of: dict = {}
        self.held = {e: deque() for e in world.specs}
        self.moving: set[str] = set()       # engines whose drain is a move (issue 35)
        self.watches: dict[tuple[str, str], Watch] = {}
        self.confirming: set[tuple[str, str]] = set()
        self.tick_handle, self.tick_at = None, math.inf
        self.ids = itertools.count(1)
        self.ports = {e: 5800 + i for i, e in enumerate(sorted(world.specs))}
        self.notes: Counter[str] = Counter()
        self.reported: dict[str, tuple] = {}
        #: per engine, the client key of its front's last answer and when it ended (issue 34)
        self.answered: dict[str, tuple[str | None, float]] = {}
        #: per engine whose park or drain is fenced (issue 34): the fence (world seconds) and
        #: the action that follows once no held request older than it is left
        self.fence: dict[str, tuple[float, str]] = {}

    # -- figures ---------------------------------------------------------------------------
    def floor_bytes(self, pci: str) -> int:
        return self.sched.ledger.cards[pci].reserve_bytes

    def reserve_fraction(self) -> float:
        return reserve_fraction(self.sched.ledger)

    def extra(self) -> dict:
        limit = self.knobs["wait_limit_s"]
        over = sum(1 for j in self.world.jobs
                   if (j.wait_s if j.done_s is not None else self.world.now - j.arrival_s) > limit)
        c = self.sched.counters
        return {"berth_rejected_with_free": c.admissions_rejected_with_free,
                "berth_counters": c.as_dict(),
                "over_wait_limit": over,
                "notes": {k: self.notes[k] for k in ("fallback", "lease.unparked", "extend",
                                                     "drain.overdue", "never")
                          if self.notes[k]}}

    # -- requests --------------------------------------------------------------------------
    def on_arrival(self, job) -> None:
        self.held[job.engine].append(job)
        self._pump(job.engine)
        self._jobs(job.engine)

    def _jobs(self, engine: str) -> None:
        """As ``berth run --front`` does: report the requests its front has (forwarded and
        running, forwarded and queued inside the engine, held), and how many of them it holds,
        each time the counts change."""
        lid = self.lease_of.get(engine)
        if lid not in self.sched.ledger.leases:
            return
        proc = self.proc_of.get(lid)
        # A cold start's requests wait in llama-swap until its health poll sees the engine
        # ready: the run's front has none of them to report (issue 24's fresh engine).
        held = [] if proc is not None and proc.state == LOADING else list(self.held[engine])
        jobs = held + (list(proc.running) + list(proc.queue) if proc else [])
        n = len(jobs)
        first = min(jobs, key=lambda j: j.arrival_s, default=None)
        oldest = None if first is None else first.arrival_s
        answered = self.answered.get(engine, (None, None))
        # Of those, the ones held at the front, not forwarded (issue 34, the fence).
        oldest_held = min((j.arrival_s for j in held), default=None)
        if self.reported.get(lid) != (n, oldest, answered, len(held), oldest_held):
            self.reported[lid] = (n, oldest, answered, len(held), oldest_held)
            self._apply(self.sched.jobs(lid, n, self.world.now, oldest,
                                        client=None if first is None else client_key(first),
                                        answered_client=answered[0],
                                        answered_at=answered[1], held=len(held),
                                        oldest_held_at=oldest_held))

    def _pump(self, engine: str) -> None:
        """Move the engine's held requests along: forward, ask for a wake, or ask for a lease."""
        if engine in self.fence:
            self._fenced(engine)
        if not self.held[engine]:
            return
        now = self.world.now
        lid = self.lease_of.get(engine)
        lease = self.sched.ledger.leases.get(lid) if lid else None
        if lease is None:
            self._new_lease(engine)
            return
        sts = lease.states()
        proc = self.proc_of.get(lid)
        if proc is not None and proc.state == READY and proc.after is None and sts <= _SERVING:
            # The front forwards no more than the engine runs at once (its slots) and holds
            # the rest: a backlog queued inside the engine would have to finish before any
            # park could begin, and every other engine would wait behind it.
            forwarded = False
            cap = (proc.spec.slots if self.max_in_flight == "slots" else
                   math.inf if self.max_in_flight is None else self.max_in_flight)
            while self.held[engine] and len(proc.running) + len(proc.queue) < cap:
                self.world.forward(self.held[engine].popleft(), proc)
                forwarded = True
            if forwarded:
                self._apply(self.sched.touch(lid, now))
        elif sts & _ASLEEP:
            first = self.held[engine][0]
            self._apply(self.sched.wake(lid, now, client_key(first), first.arrival_s))

    def _fence(self, f: Instruct, proc, act: str) -> None:
        """As ``berth run`` does with a fenced park or drain (issue 34): its front forwards as
        when open (its slots, the oldest held first) while any request older than the fence
        (the waiter's oldest request) is held or running; the instant none is, it closes, so a
        newer request held for a slot stays held and the park (or stop) waits only for what
        runs."""
        if f.fence_age_s is None:
            (self.world.park if act == "park" else self.world.stop)(proc)
            return
        self.fence[proc.engine] = (self.world.now - f.fence_age_s, act)
        self._fenced(proc.engine)

    def _fenced(self, engine: str) -> None:
        at, act = self.fence[engine]
        proc = self.proc_of.get(self.lease_of.get(engine))
        if proc is None or not proc.alive:
            del self.fence[engine]
            return
        held = self.held[engine]
        if not any(j.arrival_s < at for j in
                   itertools.chain(held, proc.running, proc.queue)):
            del self.fence[engine]
            (self.world.park if act == "park" else self.world.stop)(proc)
            return
        cap = proc.spec.slots if self.max_in_flight == "slots" else (
            math.inf if self.max_in_flight is None else self.max_in_flight)
        while held and len(proc.running) + len(proc.queue) < cap:
            self.world.forward(held.popleft(), proc)

    def _new_lease(self, engine: str) -> None:
        spec = self.world.specs[engine]
        lid = f"{engine}#{next(self.ids)}"
        # A checkpoint restores onto another card of the same kind (driver 580+, issue 35):
        # every card of a workload is of one kind.
        caps = Capabilities(park=ParkMechanism(spec.park) if spec.park else None, lend=spec.lend,
                            front=f"127.0.0.1:{self.ports[engine]}", drain=spec.drain,
                            restore_across=self.restore_across and spec.park == "checkpoint")
        lease = Lease(id=lid, engine=engine,
                      shares={p: Share(card=p, size_bytes=b) for p, b in spec.size_bytes.items()},
                      priority=spec.priority, bound=self.bound,
                      growth_allowance_bytes=spec.growth_allowance_bytes,
                      need_bytes=dict(spec.base_bytes), caps=caps)
        if spec.free:
            # As berthd's control API does for shares that name no card (issue 25): the
            # scheduler places them, and places them anew at the grant.
            lease.shares, lease.need_bytes = {}, {}
            self.sched.place(lease, [Ask(None, spec.size_bytes[p], spec.base_bytes[p])
                                     for p in spec.cards], {})
        if spec.keep_warm_s is not None:
            lease.keep_warm_s = spec.keep_warm_s
        if self.held[engine]:
            # As the run's lease request says it: the client of the request it asks for.
            first = self.held[engine][0]
            lease.demand.asked_client, lease.demand.asked_at = client_key(first), first.arrival_s
        self.lease_of[engine], self.engine_of[lid] = lid, engine
        self._apply(self.sched.request(lease, self.world.now))

    def _cards(self, engine: str, g: Granted | Instruct) -> tuple[str, ...] | None:
        """Where the grant (or a wake) placed an engine of free placement (``None``: its own
        cards)."""
        if not self.world.specs[engine].free:
            return None
        return tuple(g.cards)

    def on_job_end(self, job, ok: bool) -> None:
        if ok:
            # As the front records it: who got the answer, and when it ended (issue 34).
            self.answered[job.engine] = (client_key(job), self.world.now)
        self._pump(job.engine)
        self._jobs(job.engine)

    def on_job_start(self, job) -> None:
        lid = self.lease_of.get(job.engine)
        if lid in self.sched.ledger.leases:
            self._apply(self.sched.touch(lid, self.world.now))

    # -- effects ---------------------------------------------------------------------------
    def _apply(self, fx) -> None:
        for f in fx:
            if isinstance(f, Granted):
                e = self.engine_of[f.lease_id]
                self.proc_of[f.lease_id] = self.world.load(e, tag=f.lease_id, seen=probe.seen_at,
                                                           cards=self._cards(e, f))
            elif isinstance(f, Instruct):
                self._instruct(f)
            elif isinstance(f, Watch):
                self.watches[(f.lease_id, f.pci)] = f
                self._check_watch(f.lease_id, f.pci)
            elif isinstance(f, Rejected):
                e = self.engine_of.get(f.lease_id)
                while e and self.held[e]:
                    self.world.drop(self.held[e].popleft(), f"rejected: {f.reason}")
            elif isinstance(f, Ended):
                self._ended(f.lease_id)
            elif isinstance(f, Note):
                self.notes[f.kind] += 1
            elif isinstance(f, ReadCards):
                # berthd reads these cards at once, inside its single writer (rule 1).
                self._apply(self.sched.observe({p: self._card_read(p) for p in f.cards},
                                               self.world.now))
        self._schedule_tick()
        self._answer_lasting()

    def _answer_lasting(self) -> None:
        """As a front does: requests held for a lease (or a wake) whose wait nothing under way
        can end are answered at once with a 503 naming why (issue 12 case 6, issue 24)."""
        for engine, held in self.held.items():
            lid = self.lease_of.get(engine)
            if not held or lid not in self.sched.ledger.leases:
                continue
            why, lasting = self.sched.wait_cause(lid)
            if lasting:
                while held:
                    self.world.refuse(held.popleft(), why or "no room")
                self.world.loop.soon(self._jobs, engine)

    def on_leave(self, job) -> None:
        """Its client closed the connection while the front held it: forget it; a wake nobody
        wants any more is taken back (``unwake``)."""
        held = self.held[job.engine]
        if job in held:
            held.remove(job)
        lid = self.lease_of.get(job.engine)
        if lid in self.sched.ledger.leases and not held:
            self._apply(self.sched.unwake(lid, self.world.now))
        self._jobs(job.engine)

    def _instruct(self, f: Instruct) -> None:
        proc = self.proc_of.get(f.lease_id)
        if proc is None or not proc.alive:
            return      # it died; the exit reaches the scheduler as its own event
        w = self.world
        if f.op == Op.PARK:
            self._fence(f, proc, "park")
        elif f.op == Op.WAKE and f.call_off:
            # As berth run does: a park still waiting for its requests is called off; one
            # whose checkpoint has begun finishes, and the call-off does nothing more.
            if proc.after == "park" or self.fence.pop(proc.engine, None) is not None:
                proc.after = None
                w.loop.soon(self._called_off, f.lease_id)
        elif f.op == Op.WAKE:
            if proc.state == PARKED:
                w.restore(proc, self._cards(proc.engine, f))
            else:
                # "lease.unparked": the engine holds memory again; it must not go on to park.
                self.fence.pop(proc.engine, None)
                if proc.after == "park":
                    proc.after = None
                w.loop.soon(self._report, f.lease_id, Op.WAKE)
        elif f.op == Op.DRAIN:
            if f.move_to is not None:
                # A move (issue 35): as berth run does, the front holds requests and the run
                # asks for its card again as soon as its engine is gone.
                self.moving.add(proc.engine)
            self._fence(f, proc, "stop")
        elif f.op == Op.LEND:
            for pci in f.cards:
                w.lend(proc, pci, f.bytes[pci])
        elif f.op == Op.RETURN:
            for pci in f.cards:
                w.give_back(proc, pci, f.bytes[pci])
            w.loop.soon(self._report, f.lease_id, Op.RETURN)

    def _report(self, lid: str, op: str) -> None:
        self._apply(self.sched.report(lid, op, True, self.world.now))

    def _called_off(self, lid: str) -> None:
        if lid in self.sched.ledger.leases:
            self._apply(self.sched.report(lid, Op.PARK, False, self.world.now,
                                          "called off: the waiter has gone"))
            proc = self.proc_of.get(lid)
            if proc is not None:
                self._pump(proc.engine)

    def _ended(self, lid: str) -> None:
        e = self.engine_of.pop(lid, None)
        self.proc_of.pop(lid, None)
        for key in [k for k in self.watches if k[0] == lid]:
            del self.watches[key]
        if e is not None and self.lease_of.get(e) == lid:
            del self.lease_of[e]
            self.world.loop.soon(self._pump, e)

    def _schedule_tick(self) -> None:
        due = self.sched.next_due()
        if due is None:
            return
        if self.tick_handle is not None and self.tick_at <= due:
            return
        if self.tick_handle is not None:
            self.tick_handle.cancel()
        self.tick_at = due
        self.tick_handle = self.world.loop.at(due, self._tick)

    def _tick(self) -> None:
        self.tick_handle, self.tick_at = None, math.inf
        self._apply(self.sched.tick(self.world.now))

    # -- the driver's confirmations -------------------------------------------------------
    def _shows(self, w: Watch) -> bool:
        proc = self.proc_of.get(w.lease_id)
        if w.until == "freed":
            return proc is None or (proc.state in (EXITED, GONE) and not proc.res.get(w.pci))
        return proc is not None and proc.res.get(w.pci, 0) <= w.max_use_bytes

    def _check_watch(self, lid: str, pci: str) -> None:
        w = self.watches.get((lid, pci))
        if w is None or (lid, pci) in self.confirming or not self._shows(w):
            return
        self.confirming.add((lid, pci))
        self.world.loop.at(next_poll(w.since, self.world.now), self._confirm, lid, pci)

    def _confirm(self, lid: str, pci: str) -> None:
        self.confirming.discard((lid, pci))
        w = self.watches.get((lid, pci))
        if w is None or not self._shows(w):
            return
        del self.watches[(lid, pci)]
        if w.until != "freed" and self.world.now > w.deadline:
            return      # the helper gave up; the scheduler's own deadline falls back
        proc = self.proc_of.get(lid)
        use = proc.res.get(pci, 0) if proc is not None else 0
        # As berthd does: the confirming read is a driver read like any other, so it feeds
        # observe first (a grant need not wait for the next periodic read).
        self._apply(self.sched.observe({pci: self._card_read(pci)}, self.world.now)
                    + self.sched.confirmed(lid, pci, w.until, self.world.now, use_bytes=use))
        if w.until == "parked" and proc is not None:
            self._pump(proc.engine)     # an asleep front with held requests asks for the wake

    # -- completions from the machine -----------------------------------------------------
    def on_ready(self, proc) -> None:
        lid = proc.tag
        lease = self.sched.ledger.leases.get(lid)
        if lease is None or proc.state != READY:
            return
        if S.RESUMING in lease.states():
            self._apply(self.sched.report(lid, Op.WAKE, True, self.world.now))
        else:
            # A cold load answered its health check: berth run reports it ready (once), and
            # the engine's minimum turn starts then.
            self._apply(self.sched.ready(lid, self.world.now))
        self._pump(proc.engine)
        self._jobs(proc.engine)

    def on_parked(self, proc) -> None:
        if proc.tag in self.sched.ledger.leases:
            self._apply(self.sched.report(proc.tag, Op.PARK, True, self.world.now))
        for pci in proc.res:
            self._check_watch(proc.tag, pci)

    def on_mem(self, proc, pci: str) -> None:
        self._check_watch(proc.tag, pci)

    def on_lent(self, proc, pci: str) -> None:
        if proc.tag in self.sched.ledger.leases:
            self._apply(self.sched.report(proc.tag, Op.LEND, True, self.world.now))
        self._check_watch(proc.tag, pci)

    def on_exit(self, proc, crashed: bool) -> None:
        lid = proc.tag
        if lid in self.sched.ledger.leases:
            op = self.sched.exited if crashed else (
                lambda i, t: self.sched.report(i, Op.DRAIN, True, t))
            self._apply(op(lid, self.world.now))
        for pci in proc.res:
            self._check_watch(lid, pci)
        e = proc.engine
        if self.lease_of.get(e) == lid:
            del self.lease_of[e]
        if e in self.moving:
            self.moving.discard(e)
            if e not in self.lease_of:
                self._new_lease(e)
        self._pump(e)

    def on_freed(self, proc) -> None:
        for pci in proc.res:
            self._check_watch(proc.tag, pci)

    def _card_read(self, pci: str) -> CardRead:
        w = self.world
        leases = self.sched.ledger.leases
        used, mapped = {}, 0
        for p in w.procs_on(pci):
            if p.tag in leases:
                used[p.tag] = p.res[pci]
                mapped += p.res[pci]
        return CardRead(free_bytes=w.free(pci), stowaway_bytes=w.used[pci] - mapped,
                        used=used, total_bytes=w.total[pci])

    def on_read(self, now: float) -> None:
        self._apply(self.sched.observe({pci: self._card_read(pci) for pci in self.world.total},
                                       now))
