"""The listener's work: supervisord programs kept as Berth lease holders.

Source: issue 7; reference/hosts.md "supervisord" (stale events, buffer overflow, orphans);
seed 002 rules 1 and 6; core/run.py (the same job for a process Berth starts itself).

Each berth.toml engine entry with ``supervisor = "program"`` is one :class:`Program`. Events are
stale news: whatever arrives (a ``PROCESS_STATE_*`` event about it, a ``TICK_5``, an instruction
from berthd), the program is re-read with ``getProcessInfo`` and made true again by
:meth:`Host._sync`, which runs under the program's lock, one at a time:

1. the process the lease holds is gone. If supervisord is bringing it back (STARTING or
   BACKOFF, RUNNING under a new PID, or EXITED for less than :data:`.restart.EXITED_SETTLE_S`,
   after which ``autorestart`` would have acted), the lease keeps its room: every lease the
   listener asks for carries a restart hold (``restart_grace``, :mod:`.restart`), so berthd
   keeps the room when it sees the PID die, and step (2) attaches the new PID. Otherwise
   (stopped, FATAL, EXITED for good, or a restart that ends that way) release the lease;
   berthd ends it once a driver read shows the memory free (rule 1). A gated program stopped by
   someone else than Berth stays down;
2. a process runs and the lease has none yet (a gated program the operator started by hand):
   attach it; once the lease is granted and supervisord says RUNNING (``startsecs`` passed),
   tell berthd the program serves, so its minimum turn counts from then;
3. a process is RUNNING with no lease (observe mode, or a restart by supervisord): find the
   lease berthd already has for that PID (a restarted listener), else ask for one that adopts
   the PID. If it does not fit, it waits while the program runs: the board shows it over
   budget;
4. a gated program is STOPPED, has no lease and is not held down: ask for a lease; once granted,
   ``startProcess`` and attach. Not while an observed program is starting or not yet leased:
   its memory would be missing from berthd's count (admission reads the driver at most
   ``read_interval`` ago) and the gated program could be granted room that is being filled;
5. a drain that failed is tried again.

A ``drain`` instruction (an operator's ``berth drain``, or room for another engine) is
``stopProcess`` through supervisord (rule 6: Berth signals nothing itself), then the drain is
reported and the lease released, waiting for the driver to confirm (:mod:`.orders`). A gated
program drained to make room asks for its card again at once (it waits in the queue, and
``startProcess`` is its wake); one drained by the operator stays down until someone starts it.

Every ``TICK_5`` re-syncs every program (a dropped event is repaired) and rewrites the mapping
file (``<state dir>/supervisor-listener.json``, :mod:`.mapping`), which keeps the "held down"
marks across restarts of the listener. Leases themselves are found again in berthd's status by
PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from berth.client import ApiError, BerthdUnavailable, Client
from berth.decide.instruction import Instruction
from berth.process import identify

from berth_plugins.hookspecs import ActionContext, MechanismError
from berth_plugins.manager import run_action

from . import mapping
from .deaths import Deaths
from .orders import RETRY_MAX_S, Orders
from .plugin import MECHANISM
from .protocol import Event
from .restart import coming_back, restart_grace
from .rpc import STOPPED_STATES, ProcessInfo, Supervisor, SupervisorError, SupervisorUnavailable

__all__ = ["Program", "Host", "programs_from"]

log = logging.getLogger("berth.hosts.supervisor")


@dataclass
class Program:
    """One supervisord program under Berth. ``lease``/``pid``: the lease and the process it
    holds (``pid`` is ``None`` while a gated program's lease waits or before its start).
    ``state``/``seen_pid``: supervisord's last answer (state name, PID or 0).
    ``granted``/``ready``: the lease is granted / berthd was told the program serves (its
    minimum turn counts from then). ``down``: held down (gate: drained by the operator, stopped
    by hand, crashed). ``skip_pid``: a running process Berth will not lease again (refused).
    ``restarting``: its process exited and supervisord brings it back; the lease keeps its room
    (``exited_at``: when the listener first saw it EXITED, monotonic seconds).
    ``restart_grace_s``: the restart hold berthd is asked for (``None`` until read)."""

    engine: str
    name: str
    mode: str
    lease: str | None = None
    pid: int | None = None
    state: str | None = None
    seen_pid: int = 0
    granted: bool = False
    ready: bool = False
    down: bool = False
    skip_pid: int | None = None
    restarting: bool = False
    exited_at: float | None = None
    restart_grace_s: float | None = None
    drain: Instruction | None = None
    stopping: bool = False
    said_death: int | None = None        # the start (supervisord's) whose death was explained
    version: int = 0
    retry_s: float = 0.2
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kick: asyncio.Event = field(default_factory=asyncio.Event)

    def about(self, ev: Event) -> bool:
        """Is ``ev`` about this program (``name`` or ``group:name``)?"""
        proc, group = ev.fields.get("processname"), ev.fields.get("groupname")
        return self.name in (proc, f"{group}:{proc}")


def programs_from(cfg) -> dict[str, Program]:
    """One :class:`Program` per engine entry that names a supervisord program."""
    return {name: Program(name, e.supervisor, e.mode)
            for name, e in cfg.engines.items() if e.supervisor}


class Host:
    """The listener's asyncio side. ``on_event`` is its only entry from the protocol thread
    (through ``loop.call_soon_threadsafe``). Durations in seconds."""

    def __init__(self, cfg, sup: Supervisor, client: Client, pm, state_path: Path):
        self.cfg, self.sup, self.client, self.pm = cfg, sup, client, pm
        self.state_path = Path(state_path)
        self.programs = programs_from(cfg)
        self.release_wait_s = cfg.policy.release_grace
        self.stop_timeout_s = max(30.0, cfg.policy.release_grace)
        self.syncs = 0
        self._tasks: set[asyncio.Task] = set()
        self._full = asyncio.Lock()
        self.orders = Orders(self)
        self.deaths = Deaths(sup, client)

    # -- entry points --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Load the mapping file, sync everything, then serve events until ``stop``."""
        self._load()
        for prog in self.programs.values():
            self._spawn(self._worker(prog))
        await self.full_sync()
        await stop.wait()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def on_event(self, ev: Event) -> None:
        """An event from supervisord (already acknowledged): stale news, so only a cue."""
        if ev.name.startswith("TICK_"):
            self._spawn(self.full_sync())
            return
        if not ev.name.startswith("PROCESS_STATE"):
            return
        for prog in self.programs.values():
            if prog.about(ev):
                log.info("%s %s (pid %s)", ev.name, prog.name, ev.fields.get("pid", "-"))
                prog.kick.set()

    async def full_sync(self) -> None:
        """Re-sync every program (observed ones first: step 4), check the leases against
        berthd, rewrite the mapping file."""
        if self._full.locked():
            return
        async with self._full:
            for mode in ("observe", "gate"):
                await asyncio.gather(*(self._sync_locked(p) for p in self.programs.values()
                                       if p.mode == mode))
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self._audit()
            await self.deaths.tell_due()
            self.syncs += 1
            self._save()

    # -- the sync ------------------------------------------------------------------------------
    async def _worker(self, prog: Program) -> None:
        while True:
            await prog.kick.wait()
            prog.kick.clear()
            await self._sync_locked(prog)

    async def _sync_locked(self, prog: Program) -> None:
        try:
            async with prog.lock:
                await self._sync(prog)
            prog.retry_s = 0.2
        except (BerthdUnavailable, SupervisorUnavailable) as e:
            log.log(logging.WARNING if prog.retry_s == 0.2 else logging.DEBUG,
                    "%s: %s; trying again in %.1fs", prog.engine, e, prog.retry_s)
            asyncio.get_running_loop().call_later(prog.retry_s, prog.kick.set)
            prog.retry_s = min(prog.retry_s * 2, RETRY_MAX_S)
        except SupervisorError as e:
            log.error("%s: %s", prog.engine, e)
        except Exception:
            log.exception("syncing %s failed", prog.engine)
        if prog.mode == "observe" and not self._observed_settling():
            for gated in self.programs.values():
                if gated.mode == "gate" and gated.lease is None and not gated.down:
                    gated.kick.set()       # step (4) may go on now

    def _observed_settling(self) -> bool:
        """Is an observed program starting, or running without a lease yet? (Step 4.)"""
        return any(p.mode == "observe" and (
            p.state is None or p.state in ("STARTING", "BACKOFF")
            or (p.state == "RUNNING" and p.lease is None and p.seen_pid != p.skip_pid))
            for p in self.programs.values())

    async def _sync(self, prog: Program) -> None:
        """Steps (1)-(5) of the module docstring, for one program, under its lock."""
        info = await asyncio.to_thread(self.sup.info, prog.name)
        prog.state, prog.seen_pid = info.statename, info.pid
        await self.deaths.explain(prog, info)
        # (5)
        if prog.drain is not None:
            await self.orders.drain(prog)
            return
        # (1)
        gone = prog.lease is not None and prog.pid is not None and info.pid != prog.pid
        if gone and not prog.stopping and prog.granted and coming_back(prog, info):
            log.info("%s: pid %s exited and supervisord brings it back (%s): lease %s keeps its "
                     "room", prog.engine, prog.pid, info.statename, prog.lease)
            prog.pid, prog.ready, prog.restarting = None, False, True
        elif gone or (prog.restarting and prog.lease is not None and not info.running
                      and not coming_back(prog, info)):    # not coming back after all
            log.info("%s: pid %s is gone (%s)", prog.engine, prog.pid, info.statename)
            if prog.mode == "gate" and (prog.restarting or not prog.stopping):
                prog.down = True       # stopped or crashed outside Berth: not restarted by it
            self.forget(prog, release=True)
        if info.running:
            # (2)
            if prog.lease is not None and prog.pid is None:
                await self._attach(prog, info)
            if prog.lease is not None and prog.pid == info.pid:
                await self._ready(prog, info)
            # (3)
            elif prog.lease is None and info.statename == "RUNNING" and info.pid != prog.skip_pid:
                prog.down = False
                await self._adopt(prog, info)
        # (4)
        elif (prog.mode == "gate" and info.statename == "STOPPED" and prog.lease is None
              and not prog.down):
            if self._observed_settling():
                log.debug("%s: waiting for the observed programs to be leased before asking "
                          "for a lease", prog.engine)
            else:
                await self._request_gate(prog)
        elif prog.mode == "gate" and info.statename in STOPPED_STATES - {"STOPPED"} \
                and prog.lease is None and not prog.down:
            log.warning("%s: %s (exit status %s); Berth will not start it again until it is "
                        "started by hand", prog.engine, info.statename, info.exitstatus)
            prog.down = True

    async def _adopt(self, prog: Program, info: ProcessInfo) -> None:
        st = await self.client.status()
        for le in st["leases"]:
            if le["engine"] == prog.engine and le["pid"] == info.pid:
                log.info("%s: found lease %s for pid %s", prog.engine, le["id"], info.pid)
                granted = any(sh["state"] != "waiting" for sh in le["shares"])
                self._hold(prog, le["id"], info.pid, granted)
                prog.ready = bool(le.get("ready"))
                await self._ready(prog, info)
                return
        ident = identify(info.pid)
        if ident is None:
            return                     # gone meanwhile: the next event says what happened
        grace = await restart_grace(self.sup, prog)
        try:
            # Owned by the listener: it may release it; it outlives a restart (restart hold).
            r = await self.client.request_lease({"engine": prog.engine, "pid": ident.pid,
                                                 "start_time": ident.start_time,
                                                 "host": MECHANISM, "owner_pid": os.getpid(),
                                                 "restart_grace": grace})
        except ApiError as e:
            if identify(info.pid) is None:      # it died meanwhile: nothing runs unleased
                log.info("%s: pid %s exited before berthd answered (%s)", prog.engine,
                         info.pid, e.message)
                return
            log.error("%s: berthd refused a lease for pid %s: %s; it runs unleased",
                      prog.engine, info.pid, e.message)
            prog.skip_pid = info.pid
            return
        log.info("%s: lease %s adopts pid %s (%s)", prog.engine, r["id"], info.pid, r["state"])
        self._hold(prog, r["id"], info.pid, r["state"] != "waiting")
        await self._ready(prog, info)

    async def _attach(self, prog: Program, info: ProcessInfo) -> None:
        ident = identify(info.pid)
        if ident is None:
            return
        try:
            await self.client.attach(prog.lease, ident.pid, ident.start_time, host=MECHANISM)
        except ApiError as e:
            log.error("%s: attach of pid %s to %s refused: %s", prog.engine, info.pid,
                      prog.lease, e.message)
            return
        prog.pid, prog.restarting = ident.pid, False
        log.info("%s: lease %s holds pid %s", prog.engine, prog.lease, ident.pid)

    async def _ready(self, prog: Program, info: ProcessInfo) -> None:
        """Tell berthd the program serves, once: granted, and RUNNING in supervisord."""
        if prog.ready or not prog.granted or info.statename != "RUNNING":
            return
        try:
            await self.client.ready(prog.lease)
        except ApiError as e:
            log.warning("%s: berthd did not take the ready of %s: %s", prog.engine, prog.lease,
                        e.message)
            return
        prog.ready = True

    async def _request_gate(self, prog: Program) -> None:
        try:
            r = await self.client.request_lease({"engine": prog.engine,
                                                 "restart_grace": await restart_grace(self.sup, prog)})
        except ApiError as e:
            log.error("%s: berthd refused a lease: %s; it stays stopped", prog.engine, e.message)
            prog.down = True
            return
        log.info("%s: lease %s requested (%s); the program starts once it is granted",
                 prog.engine, r["id"], r["state"])
        self._hold(prog, r["id"], None, r["state"] != "waiting")

    def _hold(self, prog: Program, lease_id: str, pid: int | None, granted: bool) -> None:
        prog.lease, prog.pid, prog.granted, prog.ready = lease_id, pid, granted, False
        prog.version += 1
        if not granted or pid is None:   # a gated program starts on the grant, even at once
            self._spawn(self._until_granted(prog, lease_id))
        self._spawn(self.orders.follow(prog, lease_id))
        self._save()

    def forget(self, prog: Program, release: bool) -> None:
        lease, prog.lease, prog.pid = prog.lease, None, None
        prog.granted = prog.ready = prog.restarting = False
        prog.exited_at = None
        prog.version += 1
        if release and lease is not None:
            self._spawn(self.orders.release(prog, lease))
        self._save()

    # -- the grant: a gated program starts, a running one is ready ---------------------------
    async def _until_granted(self, prog: Program, lease_id: str) -> None:
        """Wait for the grant of a waiting lease; then start the program (gate) or, if it
        already runs (adopted over budget), tell berthd it serves."""
        while True:
            try:
                g = await self.client.wait_grant(lease_id, 20.0)
            except BerthdUnavailable:
                await asyncio.sleep(1.0)
                continue
            except ApiError as e:
                async with prog.lock:
                    # A running (adopted) program's lease that ended is Orders' to handle.
                    if prog.lease == lease_id and prog.pid is None:
                        self.forget(prog, release=False)
                        prog.down = e.status == 410      # ended (drained, rejected): stay down
                        log.info("%s: lease %s is gone while waiting (%s)", prog.engine,
                                 lease_id, e.message)
                        prog.kick.set()
                return
            if g.get("granted"):
                break
        async with prog.lock:
            if prog.lease != lease_id:
                return                 # forgotten meanwhile
            prog.granted = True
            if prog.pid is not None:   # already running (adopted, or attached when started)
                with contextlib.suppress(SupervisorError, SupervisorUnavailable):
                    await self._ready(prog, await asyncio.to_thread(self.sup.info, prog.name))
                return
            ctx = self.action_context(prog)
            try:
                await run_action(self.pm, "berth_start", ctx)
                info = await asyncio.to_thread(self.sup.info, prog.name)
            except (MechanismError, SupervisorError, SupervisorUnavailable) as e:
                log.error("%s: could not start it: %s; releasing lease %s", prog.engine, e,
                          lease_id)
                prog.down = True
                self.forget(prog, release=True)
                return
            log.info("%s: lease %s granted; started through supervisord as pid %s",
                     prog.engine, lease_id, info.pid)
            if info.running:
                await self._attach(prog, info)
                await self._ready(prog, info)

    # -- bookkeeping ---------------------------------------------------------------------------
    async def _audit(self) -> None:
        """Forget leases berthd no longer has (a restart that dropped them). A program whose
        lease changed while the status was on its way is left for the next audit."""
        before = {p.engine: p.version for p in self.programs.values()}
        known = {le["id"] for le in (await self.client.status())["leases"]}
        for prog in self.programs.values():
            if prog.lease is not None and prog.lease not in known \
                    and prog.version == before[prog.engine]:
                log.warning("%s: lease %s is gone from berthd", prog.engine, prog.lease)
                self.forget(prog, release=False)
                prog.kick.set()

    def action_context(self, prog: Program, timeout_s: float = 30.0) -> ActionContext:
        return ActionContext(engine=prog.engine, mechanism=MECHANISM, pid=prog.pid,
                             timeout_s=timeout_s, options={"supervisor_program": prog.name})

    def _spawn(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("a listener task failed", exc_info=t.exception())

    def _load(self) -> None:
        for name, down in mapping.read_down(self.state_path).items():
            if name in self.programs:
                self.programs[name].down = down

    def _save(self) -> None:
        mapping.write(self.state_path, self.syncs, self.programs.values())
