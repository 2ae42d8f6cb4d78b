"""The simulated machine: cards, engine processes and requests, and what each mechanism costs.

This is the *driver's* view: every byte on a card belongs to one engine process (:class:`Proc`),
and a card's use is the sum of its processes' residency. Policies act only through the
mechanisms below and learn of completions as posted events (never inside the call that started
them), as a real broker's effects report back.

Mechanisms (costs from :class:`~bench.policy.workload.Mechanisms`):

- :meth:`World.load`: a cold start or reload. The weights arrive in chunks over
  ``init_s + bytes / reload_gbps``; ``seen`` says when its manager's health check first sees it
  serve (llama-swap's poll: :meth:`Mechanisms.health_ready_s`; ``berth run``'s probe:
  :func:`berth.run.probe.seen_at`).
- :meth:`World.park`: the front closes; once every request already forwarded has finished, a
  checkpoint copies the memory to host RAM (``bytes / checkpoint_gbps``), then the memory leaves.
- :meth:`World.restore`: the memory comes back at once (an allocation), the copy takes
  ``bytes / restore_gbps``, then the engine serves.
- :meth:`World.stop`: graceful: forwarded requests finish, then the process exits after
  ``drain_s`` and the driver shows its memory free ``free_lag_s`` later.
- :meth:`World.lend` / :meth:`World.give_back`: the engine's own cap shrinks by N (it admits
  fewer requests) and trims its retained pool; the lend is done once its use is under the cap.

Requests grow their engine chunk by chunk (``chunk_bytes``). An allocation that would take a
card's use past its total is an **OOM event**: it is counted, and the allocating process dies
(its requests fail and their clients retry after ``retry_after_s``, up to ``max_attempts``).
This is measured here, from the simulated driver, never from any policy's ledger.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable

from .loop import Loop
from .metrics import Recorder
from .workload import EngineSpec, Workload

__all__ = ["World", "Proc", "Job", "LOADING", "READY", "PARKING", "PARKED", "RESTORING",
           "STOPPING", "EXITED", "GONE"]

LOADING, READY, PARKING, PARKED = "loading", "ready", "parking", "parked"
RESTORING, STOPPING, EXITED, GONE = "restoring", "stopping", "exited", "gone"
_ALIVE = frozenset({LOADING, READY, PARKING, PARKED, RESTORING})


class Job:
    """One request at run time. ``wait_s`` is the time from its first arrival to the start of
    the attempt that completed (a request whose engine died under it waits on)."""

    __slots__ = ("id", "spec", "engine", "arrival_s", "growth", "start_s", "done_s", "proc",
                 "alloc", "run_id", "failures", "dropped", "answered_s", "client", "closed")

    def __init__(self, i: int, spec, engine: EngineSpec, client: int | None = None):
        self.id, self.spec, self.engine = i, spec, spec.engine
        self.arrival_s = spec.t_s
        self.growth = engine.growth_split(spec.growth_bytes)
        self.start_s: float | None = None
        self.done_s: float | None = None
        self.proc: Proc | None = None
        self.alloc = {p: 0 for p in self.growth}
        self.run_id = -1
        self.failures = 0
        self.dropped = ""
        #: when a request that was never served ended for its client: it left, or it was
        #: answered at once with an error that names why (a 503); ``None``: neither.
        self.answered_s: float | None = None
        self.client = client
        self.closed = False

    @property
    def wait_s(self) -> float | None:
        return None if self.done_s is None else self.start_s - self.arrival_s


class Proc:
    """One engine process. ``res`` is its residency per card (bytes, what the driver shows);
    ``pool`` the growth memory it holds (the high-water mark when it retains growth);
    ``grow`` the growth its running requests have allocated; ``cap`` the most it lets itself
    use (size less any lend). ``queue`` holds requests forwarded to it and not yet started;
    ``after`` a park or stop waiting for those to finish. ``tag`` belongs to the policy."""

    __slots__ = ("id", "spec", "state", "res", "pool", "grow", "committed", "cap", "running",
                 "queue", "after", "parked", "restored", "lending", "tag", "since_s")

    def __init__(self, pid: int, spec: EngineSpec, tag, now: float):
        self.id, self.spec, self.tag, self.since_s = pid, spec, tag, now
        self.state = LOADING
        zero = {p: 0 for p in spec.cards}
        self.res, self.pool, self.grow, self.committed = dict(zero), dict(zero), dict(zero), dict(zero)
        self.cap = dict(spec.size_bytes)
        self.running: set[Job] = set()
        self.queue: deque[Job] = deque()
        self.after: str | None = None
        self.parked = dict(zero)
        self.restored = False
        self.lending: dict[str, int] = {}

    @property
    def engine(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.state in _ALIVE

    @property
    def busy(self) -> bool:
        """Requests forwarded to it are running or queued inside it."""
        return bool(self.running or self.queue)

    def __repr__(self) -> str:
        return f"<Proc {self.engine}#{self.id} {self.state}>"


class World:
    """Replays one workload under one policy. ``check``: audit the accounting after every
    event and raise ``AssertionError`` on the first mismatch (the tests use it)."""

    def __init__(self, wl: Workload, policy, *, check: bool = False, tail_s: float = 3600.0):
        self.wl, self.mech, self.policy = wl, wl.mechanisms, policy
        self.loop = Loop()
        self.total = {c.pci: c.total_bytes for c in wl.cards}
        self.used = {c.pci: 0 for c in wl.cards}
        self.specs = {e.name: e for e in wl.engines}
        self.procs: list[Proc] = []
        self.current: dict[str, Proc | None] = {e.name: None for e in wl.engines}
        self.last_used_s = {e.name: 0.0 for e in wl.engines}
        self.jobs = [Job(i, r, self.specs[r.engine]) for i, r in enumerate(wl.requests)]
        self.host_ram_bytes = 0
        self.stats = Recorder(wl, policy.name)
        self._asks: dict[str, tuple[float, bool]] = {}
        self._pid = itertools.count(1)
        # Every request not yet over, and every closed-loop client that may send another.
        self._open = len(self.jobs) + len(wl.clients)
        #: each client's draws (engine, service, think time), the same under every policy
        self._steps = [c.steps() for c in wl.clients]
        self._think = [0.0 for _ in wl.clients]
        self._horizon_s = wl.duration_s + tail_s
        if check:
            self.loop.after_each = self._audit_or_raise
        policy.attach(self)

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> Recorder:
        """Run to the last request's completion (or the horizon) and return the recorder."""
        for job in self.jobs:
            self.loop.at(job.arrival_s, self._arrive, job)
            if job.spec.leave_s is not None:
                self.loop.at(job.arrival_s + job.spec.leave_s, self._leave, job)
        for i, c in enumerate(self.wl.clients):
            self.loop.at(c.start_s, self._send, i)
        self.loop.at(0.0, self._read)
        if not self.jobs and not self.wl.clients:
            self.loop.stop()
        self.loop.run(self._horizon_s)
        for _t, covered in self._asks.values():
            if covered:
                self.stats.rejected_with_free += 1
        self.stats.finish(self.jobs, self.loop.now, self.policy)
        return self.stats

    @property
    def now(self) -> float:
        return self.loop.now

    def _post(self, hook: str, *args) -> None:
        self.loop.soon(getattr(self.policy, hook), *args)

    def _read(self) -> None:
        self.stats.sample(self.now, self.used, self._residency_by_engine(), self.host_ram_bytes)
        self.policy.on_read(self.now)
        self.loop.after(self.mech.read_interval_s, self._read)

    def _residency_by_engine(self) -> dict[str, int]:
        out = {e: 0 for e in self.specs}
        for p in self.procs:
            out[p.engine] += sum(p.res.values())
        return out

    # -- queries for policies -------------------------------------------------------------------
    def free(self, pci: str) -> int:
        """What a driver read of ``pci`` shows free now (bytes)."""
        return self.total[pci] - self.used[pci]

    def procs_on(self, pci: str) -> list[Proc]:
        return [p for p in self.procs if pci in p.res]

    # -- requests -------------------------------------------------------------------------------
    def _arrive(self, job: Job) -> None:
        if job.closed:
            return                          # its client left before this retry
        self._open_ask(job.engine)
        self.policy.on_arrival(job)

    def _send(self, client: int) -> None:
        """A closed-loop client sends its next request (it stops once past ``until_s``): to the
        engine its next step names (:meth:`ClientSpec.steps`); the think time after its answer
        is that step's."""
        spec = self.wl.clients[client]
        if self.now >= spec.until_s:
            self._close_job(None)
            return
        engine, service_s, self._think[client] = next(self._steps[client])
        job = Job(len(self.jobs), spec.request(self.now, engine, service_s), self.specs[engine],
                  client)
        self.jobs.append(job)           # the client's pending send, counted open, is this job
        self._arrive(job)

    def _leave(self, job: Job) -> None:
        """The client gives up on a request that has not started: the policy forgets it."""
        if job.closed or job.start_s is not None:
            return
        job.dropped, job.answered_s = "client left", self.now
        if job.proc is not None:
            # Forwarded and queued inside the engine: the proxy closes that connection too.
            job.proc.queue.remove(job)
            job.proc = None
            self._post("on_job_end", job, False)
        else:
            self.policy.on_leave(job)
        self._close_job(job)

    def refuse(self, job: Job, why: str) -> None:
        """The policy answers ``job`` at once with an error that names ``why`` (a front's
        503 when nothing under way can give its engine the card); its client gets an answer,
        not a hang."""
        self.stats.refusals[f"503 {why.split(':')[0]}"] += 1
        job.dropped, job.answered_s = f"refused: {why}", self.now
        self._close_job(job)

    def forward(self, job: Job, proc: Proc) -> None:
        """Hand ``job`` to ``proc`` (it runs once the engine is ready and has room). A job whose
        client has gone is not sent."""
        if job.closed:
            return
        if proc.state not in (LOADING, READY, RESTORING):
            raise RuntimeError(f"forward {job.id} to {proc!r}: not loading, ready or restoring")
        job.proc = proc
        if set(job.growth) != set(proc.spec.cards):
            # An engine placed anew (issue 25): its requests grow it on its cards of now.
            job.growth = proc.spec.growth_split(job.spec.growth_bytes)
            job.alloc = {p: 0 for p in job.growth}
        proc.queue.append(job)
        self._serve(proc)

    def retry(self, job: Job, after_s: float, why: str) -> None:
        """The policy refused ``job`` (a 429, a full queue); its client retries later."""
        self.stats.refusals[why] += 1
        self.loop.after(after_s, self._arrive, job)

    def drop(self, job: Job, why: str) -> None:
        """The policy gave up on ``job`` for good."""
        job.dropped = why
        self._close_job(job)

    def _serve(self, proc: Proc) -> None:
        if proc.state != READY:
            return
        base = proc.spec.base_bytes
        while proc.queue and len(proc.running) < proc.spec.slots:
            job = proc.queue[0]
            if job.closed:
                proc.queue.popleft()
                continue
            if any(base[p] + proc.committed[p] + g > proc.cap[p] for p, g in job.growth.items()):
                break
            proc.queue.popleft()
            self._start(job, proc)

    def _start(self, job: Job, proc: Proc) -> None:
        job.start_s = self.now
        job.run_id = next(self._pid)
        proc.running.add(job)
        for p, g in job.growth.items():
            proc.committed[p] += g
            job.alloc[p] = 0
        self.last_used_s[proc.engine] = self.now
        chunk, ramp = self.mech.chunk_bytes, job.spec.ramp_s
        for p, g in job.growth.items():
            n = math.ceil(g / chunk) if g > 0 else 0
            for k in range(n):
                self.loop.at(self.now + ramp * k / n, self._grow, job, job.run_id, p,
                             min(chunk, g - k * chunk))
        self.loop.after(job.spec.service_s, self._finish, job, job.run_id)
        self._post("on_job_start", job)

    def _grow(self, job: Job, run_id: int, pci: str, n: int) -> None:
        proc = job.proc
        if job.run_id != run_id or proc is None:
            return
        proc.grow[pci] += n
        job.alloc[pci] += n
        phys = max(0, proc.grow[pci] - proc.pool[pci]) if proc.spec.retain_growth else n
        if phys and self._add(proc, pci, phys):
            proc.pool[pci] += phys

    def _finish(self, job: Job, run_id: int) -> None:
        proc = job.proc
        if job.run_id != run_id or proc is None:
            return
        proc.running.discard(job)
        for p, g in job.growth.items():
            proc.committed[p] -= g
            proc.grow[p] -= job.alloc[p]
            if not proc.spec.retain_growth:
                proc.pool[p] -= job.alloc[p]
                self._sub(proc, p, job.alloc[p])
        job.done_s, job.proc = self.now, None
        self.last_used_s[proc.engine] = self.now
        self._post("on_job_end", job, True)
        self._close_job(job)
        self._serve(proc)
        self._check_lend(proc)
        self._maybe_after(proc)

    def _fail(self, job: Job) -> None:
        job.failures += 1
        job.proc, job.run_id = None, -1
        self.stats.failed_attempts += 1
        self._post("on_job_end", job, False)
        if job.failures >= self.mech.max_attempts:
            self.drop(job, "failed too often")
        else:
            self.loop.after(self.mech.retry_after_s, self._arrive, job)

    def _close_job(self, job: Job | None) -> None:
        """One request is over (``None``: a client sends no more). A closed-loop client's
        next request follows its pause."""
        if job is not None:
            if job.closed:
                return
            job.closed = True
            if job.client is not None:
                self.loop.after(self._think[job.client], self._send, job.client)
                self._open += 1         # the client's next send is still to come
        self._open -= 1
        if self._open == 0:
            self.loop.stop()

    # -- memory ----------------------------------------------------------------------------------
    def _add(self, proc: Proc, pci: str, n: int) -> bool:
        """Allocate ``n`` bytes for ``proc``; an allocation past the card's total is an OOM
        event and kills the allocating process (returns False)."""
        if self.used[pci] + n > self.total[pci]:
            self.stats.oom(self.now, pci, proc.engine, self.used[pci], n)
            self._crash(proc)
            return False
        self.used[pci] += n
        proc.res[pci] += n
        return True

    def _sub(self, proc: Proc, pci: str, n: int) -> None:
        self.used[pci] -= n
        proc.res[pci] -= n
        self._post("on_mem", proc, pci)

    # -- mechanisms -----------------------------------------------------------------------------
    def load(self, engine: str, tag=None, seen: Callable[[float], float] | None = None,
             cards: tuple[str, ...] | None = None) -> Proc:
        """Start ``engine`` cold; it becomes its engine's current process. Returns the process;
        ``on_ready`` is posted when it serves: when ``seen(load_s)`` says its manager's health
        check first sees it answer (seconds after the start; ``None``: at once).
        ``cards``: where a policy that places puts an engine with ``free`` placement (``None``:
        its own cards)."""
        spec = self.specs[engine]
        if cards is not None and tuple(cards) != spec.cards:
            if not spec.free:
                raise RuntimeError(f"load {engine} on {cards}: its placement is fixed")
            spec = spec.on(tuple(cards))
        self.stats.placed(engine, spec.cards)
        proc = Proc(next(self._pid), spec, tag, self.now)
        self.procs.append(proc)
        self.current[engine] = proc
        self._close_ask(engine)
        total = sum(spec.base_bytes.values())
        dur = self.mech.load_s(total)
        chunk = self.mech.chunk_bytes
        for p, b in spec.base_bytes.items():
            n = math.ceil(b / chunk)
            for k in range(1, n + 1):
                self.loop.at(self.now + dur * k / n, self._load_chunk, proc, p,
                             min(chunk, b - (k - 1) * chunk))
        ready = dur if seen is None else max(dur, seen(dur))
        if ready > dur:
            # The engine answers its own health probe now; its manager sees it at its next poll.
            self.loop.at(self.now + dur, self._post, "on_loaded", proc)
        self.loop.at(self.now + ready, self._loaded, proc)
        self.stats.switch("load", total)
        return proc

    def _load_chunk(self, proc: Proc, pci: str, n: int) -> None:
        if proc.state == LOADING:
            self._add(proc, pci, n)

    def _loaded(self, proc: Proc) -> None:
        if proc.state != LOADING:
            return
        proc.state, proc.since_s = READY, self.now
        self._post("on_ready", proc)
        self._serve(proc)
        self._maybe_after(proc)

    def park(self, proc: Proc) -> None:
        """Close the front, let forwarded requests finish, then checkpoint to host RAM."""
        if proc.state in (LOADING, READY, RESTORING) and proc.after is None:
            proc.after = "park"
            self._maybe_after(proc)

    def _maybe_after(self, proc: Proc) -> None:
        if proc.after is None or proc.state != READY or proc.busy:
            return
        act, proc.after = proc.after, None
        if act == "park":
            proc.state = PARKING
            n = sum(proc.res.values())
            self.loop.after(self.mech.checkpoint_s(n), self._parked, proc)
        else:
            self._do_stop(proc)

    def _parked(self, proc: Proc) -> None:
        if proc.state != PARKING:
            return
        proc.state, proc.since_s = PARKED, self.now
        proc.parked = dict(proc.res)
        n = sum(proc.parked.values())
        self.host_ram_bytes += n
        for p, b in proc.parked.items():
            self._sub(proc, p, b)
        self.stats.switch("park", n)
        self._post("on_parked", proc)
        if proc.after == "stop":
            proc.after = None
            self._do_stop(proc)

    def restore(self, proc: Proc, cards: tuple[str, ...] | None = None) -> None:
        """Bring a parked engine back: allocate its memory, copy, then serve. ``cards``: where
        a checkpoint of an engine of free placement is restored when not where it parked
        (``cuda-checkpoint --device-map``, issue 35), its cards in the order of its own."""
        if proc.state != PARKED:
            raise RuntimeError(f"restore {proc!r}: not parked")
        if cards is not None and tuple(cards) != proc.spec.cards:
            self._rehome(proc, tuple(cards))
        self._close_ask(proc.engine)
        proc.state = RESTORING
        back, proc.parked = proc.parked, {p: 0 for p in proc.parked}
        n = sum(back.values())
        self.host_ram_bytes -= n
        for p, b in back.items():
            if not self._add(proc, p, b):
                return
        self.loop.after(self.mech.restore_s(n), self._restored, proc, n)

    def _rehome(self, proc: Proc, cards: tuple[str, ...]) -> None:
        """A parked process's cards change (it holds nothing on any card while parked)."""
        if not proc.spec.free:
            raise RuntimeError(f"restore {proc!r} on {cards}: its placement is fixed")
        if any(proc.res.values()) or proc.lending:
            raise RuntimeError(f"restore {proc!r} on {cards}: it still holds memory")
        m = dict(zip(proc.spec.cards, cards, strict=True))
        proc.spec = proc.spec.on(cards)
        for name in ("res", "pool", "grow", "committed", "cap", "parked"):
            setattr(proc, name, {m[p]: v for p, v in getattr(proc, name).items()})
        self.stats.placed(proc.engine, cards)

    def _restored(self, proc: Proc, n: int) -> None:
        if proc.state != RESTORING:
            return
        proc.state, proc.since_s, proc.restored = READY, self.now, True
        self.stats.switch("wake", n)
        self._post("on_ready", proc)
        self._serve(proc)
        self._maybe_after(proc)

    def stop(self, proc: Proc) -> None:
        """Stop ``proc`` gracefully (see the module docstring); a stop during a load aborts it.
        An engine that nobody can stop (``drain`` false: an in-process host) runs on."""
        if not proc.spec.drain:
            return
        if proc.state == LOADING:
            for job in list(proc.queue):
                self._fail(job)
            proc.queue.clear()
            self._do_stop(proc)
        elif proc.state == PARKED:
            self._do_stop(proc)
        elif proc.state in (READY, PARKING, RESTORING):
            proc.after = "stop"
            self._maybe_after(proc)

    def _do_stop(self, proc: Proc) -> None:
        proc.state = STOPPING
        self.stats.switch("drain", 0)
        self.loop.after(self.mech.drain_s, self._exit, proc, False)

    def _crash(self, proc: Proc) -> None:
        if not proc.alive and proc.state != STOPPING:
            return
        self.stats.switch("crash", 0)
        for job in sorted(proc.running, key=lambda j: j.id) + list(proc.queue):  # set order follows addresses: sort, so one seed gives one result
            self._fail(job)
        proc.running.clear()
        proc.queue.clear()
        proc.after = None
        self._exit(proc, True)

    def _exit(self, proc: Proc, crashed: bool) -> None:
        if proc.state in (EXITED, GONE):
            return
        self.host_ram_bytes -= sum(proc.parked.values())   # a checkpoint dies with its process
        proc.parked = {p: 0 for p in proc.parked}
        proc.state, proc.since_s = EXITED, self.now
        if self.current[proc.engine] is proc:
            self.current[proc.engine] = None
        self._post("on_exit", proc, crashed)
        if any(proc.res.values()):
            self.loop.after(self.mech.free_lag_s, self._gone, proc)
        else:
            self._gone(proc)

    def _gone(self, proc: Proc) -> None:
        for p, b in proc.res.items():
            if b:
                self._sub(proc, p, b)
        proc.state = GONE
        self.procs.remove(proc)
        self._post("on_freed", proc)

    def lend(self, proc: Proc, pci: str, n: int) -> None:
        """Shrink the engine's own cap on ``pci`` by ``n`` bytes; ``on_lent`` when its use fits."""
        proc.cap[pci] -= n
        proc.lending[pci] = n
        self._check_lend(proc)

    def give_back(self, proc: Proc, pci: str, n: int) -> None:
        proc.cap[pci] += n
        proc.lending.pop(pci, None)
        self.stats.switch("return", n)
        self._serve(proc)

    def _check_lend(self, proc: Proc) -> None:
        for p, n in list(proc.lending.items()):
            if proc.spec.retain_growth:
                trim = proc.pool[p] - max(proc.grow[p], proc.cap[p] - proc.spec.base_bytes[p])
                if trim > 0:
                    proc.pool[p] -= trim
                    self._sub(proc, p, trim)
            if proc.res[p] <= proc.cap[p]:
                del proc.lending[p]
                self.stats.switch("lend", n)
                self._post("on_lent", proc, p)

    # -- admissions refused with free memory ---------------------------------------------------
    def _open_ask(self, engine: str) -> None:
        """A request needs its engine started (cold, or woken): note whether the memory it
        needs was free (above the policy's floor) right then."""
        if engine in self._asks:
            return
        cur = self.current[engine]
        spec = self.specs[engine]
        if cur is None or cur.state in (STOPPING, EXITED, GONE):
            need = spec.base_bytes
        elif cur.state == PARKED:
            need = cur.parked
        else:
            return
        covered = all(self.free(p) - self.policy.floor_bytes(p) >= b for p, b in need.items())
        self._asks[engine] = (self.now, covered)

    def _close_ask(self, engine: str) -> None:
        t, covered = self._asks.pop(engine, (self.now, False))
        if covered and self.now > t:
            self.stats.rejected_with_free += 1

    # -- accounting -----------------------------------------------------------------------------
    def audit(self) -> list[str]:
        """Every way the books disagree right now: a card's use against the sum of its
        processes' residency (conservation of bytes), use past the total, negative figures."""
        bad = []
        for pci in self.total:
            s = sum(p.res.get(pci, 0) for p in self.procs)
            by_engine = sum(self._residency_on(pci).values())
            if not s == by_engine == self.used[pci]:
                bad.append(f"{pci}: used {self.used[pci]} != Σ residency {s} / {by_engine}")
            if self.used[pci] > self.total[pci]:
                bad.append(f"{pci}: used {self.used[pci]} > total {self.total[pci]}")
        for p in self.procs:
            for pci in p.res:
                if p.res[pci] < 0 or p.grow[pci] < 0 or p.pool[pci] < 0:
                    bad.append(f"{p!r} on {pci}: negative residency or pool")
        parked = sum(sum(p.parked.values()) for p in self.procs)
        if self.host_ram_bytes != parked:
            bad.append(f"host RAM {self.host_ram_bytes} != Σ checkpointed {parked}")
        return bad

    def _residency_on(self, pci: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.procs:
            out[p.engine] = out.get(p.engine, 0) + p.res.get(pci, 0)
        return out

    def _audit_or_raise(self) -> None:
        bad = self.audit()
        if bad:
            raise AssertionError(f"t={self.now:.3f}: " + "; ".join(bad))
