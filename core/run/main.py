"""``berth run``: one engine run under a lease, behind its own front.

Source: issue 5; seed 002 "Fronts", rule 3, "Why the run owns the front for a routed engine",
stage A1; reference/llama-swap.md ("Consequences for a cmd wrapper").

:class:`EngineRun` puts the parts together; each has its own module:
:mod:`berth.run.lease` (berthd), :mod:`berth.run.engine` (the process),
:mod:`berth.run.actions` (park, wake, lend, return, drain), :mod:`berth.run.watchdog`,
:mod:`berth.run.cli` (the command line).

1. Ask berthd for a lease and wait. The front is up from the start: while waiting it answers
   reads (``/health`` included) with 503, so llama-swap keeps polling, and it holds writes.
2. Pick a free port for the engine, put it in place of ``{port}`` in CMD, start CMD without a
   shell in its own process group, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and
   ``CUDA_VISIBLE_DEVICES`` set to the granted cards (by UUID).
3. Attach its PID and start time, wait for its health, then open the front.
4. Carry out berthd's instructions: park (close the front, wait for in-flight requests, then
   the park mechanism: cuda-checkpoint on every CUDA process of the engine's tree, or a hook),
   wake (restore, probe health, open), lend, return, drain (stop). berthd confirms every
   release with a driver read (rule 1); the run's word is never proof. After a drain the run
   and its front stay (issue 35; ``--exit-on-drain`` exits instead): berthd's board lists it as
   drained, the next write asks for a new grant, and the engine starts again on the card given.
   A run with no front stays too (a supervisord program that exits 0 is not restarted): it
   asks for its card again at once, as a waiter no holder makes room for (no drain back, so
   two programs never swap a card endlessly), and starts the engine again when granted.
5. On SIGTERM/SIGINT (llama-swap's stop) or SIGHUP (its terminal closed): close the front,
   wait for in-flight requests up to a grace, SIGTERM the engine's group, then SIGKILL, wait
   for the driver to confirm the memory free, release the lease, exit. The defaults fit llama-swap's ``unloadTimeout`` of 10 s
   (1 s + 4 s + 3 s + a little). A run stopped by a signal exits one code in every state
   (waiting for a grant, starting, serving, drained): 130 for SIGINT (Ctrl-C), 129 for SIGHUP,
   0 for SIGTERM (a manager's stop, carried out); the engine's own code is logged. A run whose
   engine exits on its own exits with the engine's code.

The engine never outlives the run: the child gets a parent-death SIGKILL, and a watchdog in its
own session kills the engine's whole group when the run dies by any path, SIGKILL included.

Start-up and stop go through one :class:`contextlib.AsyncExitStack`, as berthd's do: the
signal handlers (removed at the end), the front, the lease client, the engine's HTTP session and
every task are each pushed as they start, so any exit, an exception's included, cancels the
tasks and closes the rest in reverse. The front listens before anything else loads: it needs
only asyncio and httptools, and llama-swap polls its health 250 ms after starting the ``cmd``
(issue 30). The config (pydantic), the plugins and aiohttp load after it listens; a config
that does not load ends the run with exit 2 and one line naming the problem.

It fails open: if berthd is down at start, the engine runs unleased (with a warning) and the
front forwards; if berthd dies later, the front keeps forwarding, and the run re-attaches when
berthd is back (or asks for a new lease if berthd lost the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING, Coroutine

from berth import paths, startup
from berth.config.errors import ConfigError
from berth.decide.model import Op
from berth.front import Front, FrontState
from berth.front.rules import default_is_write
from berth.run.front_port import listen_front
from berth.run.slots import Slots

if TYPE_CHECKING:                   # loaded once the front listens (EngineRun._load)
    from berth.run.actions import Actions
    from berth.run.cli import RunOptions
    from berth.run.engine import EngineProcess
    from berth.run.lease import LeaseClient

__all__ = ["EngineRun"]

log = logging.getLogger("berth.run")


#: Seconds a run whose lease berthd refused keeps its front answering the reason (a 503).
REFUSED_LINGER_S = 3.0


def _task(stack: contextlib.AsyncExitStack, coro: Coroutine) -> asyncio.Task:
    """A task that ``stack`` cancels, and waits for, when it closes (on any exit)."""
    task = asyncio.create_task(coro)
    stack.push_async_callback(_cancel, task)
    return task


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


#: The signals that stop a run in order (step 5). SIGHUP: the terminal it runs in closed; its
#: default action killed the run with no stop sequence.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def signal_code(signum: int | None) -> int:
    """A run's exit code after the stop signal ``signum``, whatever the run was doing: 130 for
    SIGINT (Ctrl-C) and 129 for SIGHUP (its terminal closed), as a shell tool interrupted; 0
    for SIGTERM, a manager's stop carried out. llama-swap logs any other code as "process
    exited with error" at every swap, and systemd marks a unit failed on 143 unless told
    ``SuccessExitStatus=143``."""
    if signum in (signal.SIGINT, signal.SIGHUP):
        return 128 + signum
    return 0


def _say_stopped(engine: str, code: int, signum: int | None) -> None:
    """Log the engine's own exit code (or the signal that ended it), which the run's code,
    the signal's, no longer carries."""
    how = f"exit code {code}" if code >= 0 else signal.Signals(-code).name
    log.info("%s stopped with %s; the run exits %s (stopped by %s)", engine, how,
             signal_code(signum), signal.Signals(signum or signal.SIGTERM).name)


def _ran_on(lease: LeaseClient) -> list[str]:
    """The PCI addresses of the cards this round's engine ran on (a move's from)."""
    return [c["pci"] for c in lease.cards or [] if isinstance(c, dict) and "pci" in c]


def _drained_note(run: "EngineRun"):
    """berthd's entry for ``run``, just drained, started."""
    from berth.run.drained import DrainedNote
    note = DrainedNote(run.o.engine, run.front, run.actions.drained, run.actions.move_to,
                       _ran_on(run.lease), run.o.aliases, on_wake=lambda: _woken(run))
    note.start()
    return note


def _woken(run: "EngineRun") -> bool:
    """An operator's ``berth wake`` for drained ``run``: it asks for its card again now, as a
    write would make it, and keeps asking with no request held (its engine starts when
    granted). False when the run is not waiting behind its front (it asks already)."""
    again = run._again
    if again is None or again.is_set():
        return False
    run._operator_wake = True
    again.set()
    return True


async def _ask_again(run: "EngineRun") -> None:
    """A write came for drained ``run`` (or it moves, or an operator woke it): the next round's
    lease, which asks for a new grant."""
    run._note.asking()
    run._moving = bool(run.actions.move_to) or run._operator_wake
    run._operator_wake = False      # heard: the next drain waits for a write again
    await run.lease.close()
    run._new_lease()
    run._wire()
    if run.front is not None and not run.front.holding and not run._moving:
        run.lease.unwanted.set()   # the write that asked has gone already


def _unwanted(run: "EngineRun") -> None:
    """The requests held for a wake have all gone: the wake is withdrawn, and so is a drained
    run's new grant asked for them (not a move's), so that it drains no engine in use."""
    if run.lease is not None and run._again is not None and not run.lease.leased \
            and not run._moving:
        run.lease.unwanted.set()
    elif run.lease is not None:
        run.lease.on_unwanted()


def _declared_slots(engine: str) -> int | None:
    """The slots the engine's entry in berth.toml declares (``--slots`` wins), if any."""
    from berth.config import load_config
    entry = load_config()[0].engines.get(engine)
    return entry.slots if entry is not None else None


class EngineRun:
    """One run of one engine: its front, lease, engine process and actions. :meth:`main`
    returns the exit code."""

    def __init__(self, opts: RunOptions):
        self.o = opts
        self.stop_event = asyncio.Event()
        self.front: Front | None = None
        self.lease: LeaseClient | None = None
        self.engine: EngineProcess | None = None
        self.actions: Actions | None = None
        self._is_write = default_is_write        # the plugins' rule once they are loaded
        self._pm = None                          # the plugin manager, once loaded
        self.signalled = False                   # a stop signal came (not a drain)
        self.signum: int | None = None           # the first stop signal's number
        # set: a write came for a drained engine (or it moves); it stays, set, until the
        # engine serves again, so a write meanwhile asks for nothing more (issue 35)
        self._again: asyncio.Event | None = None
        self._moving = False    # it asks for a card again for a move or a wake, not a write
        self._operator_wake = False     # ``berth wake`` asked this drained run to start again
        self.slots = Slots(opts)                 # what the front forwards at once (issue 34)
        self._note = None                        # berthd's entry while drained (DrainedNote)

    async def main(self) -> int:
        """Start, serve until the engine exits or a stop signal (:data:`STOP_SIGNALS`) or a
        drain, stop. The exit code when a stop signal ended the run, in any state: 130 for
        SIGINT, 129 for SIGHUP, 0 for SIGTERM (:func:`signal_code`); else the engine's when it
        exited on its own (0 after a drain with ``--exit-on-drain``); 2 when the front cannot
        listen (another process listens on its port, or a connection still holds it after
        :data:`~berth.run.front_port.PORT_WAIT_S`) or the config does not load; 1 when berthd
        refused the lease."""
        async with contextlib.AsyncExitStack() as stack:
            loop = asyncio.get_running_loop()
            # An engine that double-forks stays in the run's tree (issue 36).
            from berth.run.reaper import become_subreaper
            become_subreaper()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._signalled, sig)
                stack.callback(loop.remove_signal_handler, sig)
            if self.o.front and not await self._listen(stack):
                return signal_code(self.signum) if self.signalled else 2
            try:
                await self._load(stack)
            except ConfigError as e:
                log.error("%s", e)
                if self.front is not None:
                    self.front.stopped(f"berth run cannot start: {e}")
                return 2
            startup.started()                   # its modules are loaded: collect again
            code = await self._serve(stack)
        return signal_code(self.signum) if self.signalled else code

    def _signalled(self, signum: int = signal.SIGTERM) -> None:
        self.signum = self.signum or signum        # the first stop signal names the code
        self.signalled = True
        self.stop_event.set()

    async def _listen(self, stack: contextlib.AsyncExitStack) -> bool:
        """The front listens on ``--front``, state ``starting`` (reads 503, writes held). The
        lease's callbacks reach it through this run: the lease client loads only after."""
        host, _, port = self.o.front.rpartition(":")
        limit = {"wait_limit_s": self.o.wait_limit_s} if self.o.wait_limit_s else {}
        front = Front(host or "127.0.0.1", int(port), name=self.o.engine, **limit,
                      on_wake=self._on_wake, on_activity=self._on_activity,
                      is_write=lambda method, path: self._is_write(method, path),
                      max_in_flight=self.slots.n, on_unwanted=self._on_unwanted)
        if self.o.front_health and self.o.health != "none":
            front.ready_path = self.o.health     # llama-swap hands a held request over at once
        # A port only a connection holds (not a listener) is waited for (berth.run.front_port).
        if not await listen_front(front, self.o.front, self.stop_event):
            return False
        stack.push_async_callback(front.stop)
        self.front = front
        return True

    async def _load(self, stack: contextlib.AsyncExitStack) -> None:
        """What the run needs past its front: the plugins, the lease client (berthd's socket
        from the config), the engine and its HTTP session, the actions. Raises
        :class:`ConfigError`."""
        import aiohttp
        from berth.run.engine import EngineProcess

        from berth_plugins.manager import is_write, make_plugin_manager
        paths.client_socket()       # the config loads, or the run ends here (not fail-open)
        self.slots.declare(_declared_slots(self.o.engine))
        self._pm = pm = make_plugin_manager()
        stack.push_async_callback(self._close_lease)
        self._new_lease()
        self.engine = EngineProcess(self.o)
        self.engine.http = aiohttp.ClientSession()
        stack.push_async_callback(self.engine.http.close)
        self._is_write = lambda method, path: is_write(pm, self.o.engine, method, path)
        self._wire()

    def _new_lease(self) -> None:
        """This round's lease client; after a drain, one with no front makes no room (step 4)."""
        from berth.run.lease import LeaseClient
        self.lease = LeaseClient(self.o, self.stop_event)
        self.lease.front = self.lease.waits.front = self.front
        self.lease.makes_room = self.front is not None or self.actions is None
        if self.front is not None:
            self.front.wait_limit_s = self.lease.limit("wait_limit_s")

    def _wire(self) -> None:
        """The actions over this round's lease (replaced after a drain, for the next round)."""
        from berth.run.actions import Actions
        self.actions = Actions(self.o, self._pm, self.lease, self.engine, self.front,
                               self.stop_event)

    async def _close_lease(self) -> None:
        if self.lease is not None:
            await self.lease.close()

    # The front's callbacks: a wake, activity and an unwanted wake need a lease, which exists
    # by then (the front is open, or asleep after a park, only once the run holds one).
    async def _on_wake(self) -> None:
        """The front holds a write while asleep: after a drain the run starts the engine again;
        otherwise berthd is asked to wake the parked lease. Between a drain and the engine
        serving again the run is asking for its new grant, or starting the engine, on its own:
        the write is held until the front opens (the lease it would wake has no id yet, and
        a wake of it was answered 503 "berthd is unavailable"; issue 35)."""
        if self._again is not None:
            self._again.set()
            return
        await self.lease.on_wake()

    def _on_activity(self) -> None:
        if self.lease is not None:
            self.lease.on_activity()

    def _on_unwanted(self) -> None:
        _unwanted(self)

    async def _serve(self, stack: contextlib.AsyncExitStack) -> int:
        """Serve lease after lease: one round, and after a drain (unless ``--exit-on-drain``)
        the next when a write arrives (a stop signal ends it). Meanwhile berthd's board lists
        the run as drained, with its waiters (:class:`~berth.run.drained.DrainedNote`)."""
        stack.push_async_callback(self._note_done)
        while True:
            code = await self._round()
            if self.lease.withdrawn and self._note is not None and not self.signalled:
                self._note.asking(False)     # nobody waited for the new grant: drained again
            elif not self._keeps():
                return code
            else:
                await self._note_done()
                self._note = _drained_note(self)
            if not await self._drained():
                return signal_code(self.signum)
            await _ask_again(self)

    async def _note_done(self) -> None:
        """The engine serves again, or the run ends: berthd's board drops it from drained."""
        note, self._note = self._note, None
        if note is not None:
            await note.close()

    def _keeps(self) -> bool:
        """berthd drained the engine (no stop signal), and the run keeps its front (issue 35:
        the default; ``--exit-on-drain`` opts out): the run and its front stay, whether the
        engine served or was drained while it still started."""
        return bool(self.o.keep_front and self.actions is not None
                    and self.actions.drained and not self.signalled
                    and (self.front is None or self.front.state is not FrontState.STOPPED))

    async def _drained(self) -> bool:
        """After a drain the front sleeps, holding writes; True when one arrives (the run asks
        for a new grant and starts the engine again on the card it is given), False on a stop
        signal. With no front: True at once (unless signalled)."""
        self.stop_event.clear()
        if self.signalled:
            return False
        if self.front is None:
            log.info("%s drained; with no front it asks berthd for its card again now and waits "
                     "for room (it makes none)", self.o.engine)
            return True
        self._again = again = asyncio.Event()
        if self.front.holding and self.front.state in (FrontState.ASLEEP, FrontState.STARTING,
                                                        FrontState.WAKING):
            again.set()                 # drained with writes held (parked, or still starting)
        if self.actions.move_to:
            again.set()                 # a move: ask for the card again at once (issue 35)
            log.info("%s moves; its front holds requests meanwhile", self.o.engine)
        self.front.sleep(engine="drained")
        log.info("%s drained; its front stays and holds writes", self.o.engine)
        async with contextlib.AsyncExitStack() as tasks:
            ends = {_task(tasks, self.stop_event.wait()), _task(tasks, again.wait())}
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        woken = again.is_set() and not self.signalled
        if not woken:
            self._again = None
        return woken

    async def _round(self) -> int:
        """One lease: ask, start the engine on the granted cards, serve, and end by the
        engine's exit or a stop (signal or drain). Returns the exit code."""
        from berth.run.engine import NoEngine
        if await self.lease.acquire() is None:
            if self.lease.refused is not None and self.front is not None:
                # The front answers why for a moment (a client that sent its request as the
                # run started gets the reason, not a refused connection: issue 36).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), REFUSED_LINGER_S)
            return signal_code(self.signum) if self.stop_event.is_set() else 1
        try:
            ident = await self.engine.spawn(self.lease.cards, self.lease.lease_id,
                                             self.lease.driver)
        except NoEngine as e:
            if self.front is not None:
                self.front.stopped("the engine could not be started")
            await self.lease.release("the engine could not be started")
            return e.code
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.engine.let_watchdog_go)
            stack.push_async_exit(self._stop_after_error)
            if self.lease.unleased is not None:
                # Started unleased: the next run measures once this engine's memory shows.
                _task(stack, self.lease.unleased.hold(self.engine))
            return await self._engine_runs(ident)

    async def _engine_runs(self, ident) -> int:
        """The engine ``ident`` (PID, start time) started: serve until it exits or is told to
        stop. Returns its exit code."""
        await self.lease.attach(ident)
        if self.front is not None and self.engine.url:
            self.front.set_upstream(self.engine.url)
        exited = await self._until_done()
        if exited is None:
            code = await self._stop("stop signal")
            if self.signalled:
                _say_stopped(self.o.engine, code, self.signum)
            return code
        log.info("%s exited on its own with %s", self.o.engine, exited)
        if self.front is not None:
            self.front.stopped("engine exited")
        await self.lease.release("engine exited")
        return exited

    async def _until_done(self) -> int | None:
        """Open the front once the engine answers its health, follow berthd's instructions and
        report the front's jobs, until the engine exits (its code) or the run is told to stop
        (``None``). Every task here is cancelled before this returns, by any path."""
        from berth.run.waits import job_reporter
        async with contextlib.AsyncExitStack() as tasks:
            engine_exit = _task(tasks, self.engine.proc.wait())
            stop = _task(tasks, self.stop_event.wait())
            healthy = _task(tasks, self.engine.until_healthy())
            ends = {engine_exit, stop}
            done, _ = await asyncio.wait(ends | {healthy}, return_when=asyncio.FIRST_COMPLETED)
            # This lease's requests served are counted from here (issue 24).
            served_from = self.front.served if self.front is not None else 0
            if healthy in done and healthy.result():
                if self.lease.unleased is not None:
                    self.lease.unleased.answered(self.engine)
                if self.front is not None:
                    # Before it opens: the held requests go at most the engine's slots at once.
                    await self.slots.measure(self.engine.http, self.engine.url)
                    self.slots.apply(self.front)
                    self.front.open()
                self._again = None          # a drained engine serves again
                log.info("%s is serving%s", self.o.engine, f" on {self.engine.url}"
                         if self.engine.url else f" (pid {self.engine.proc.pid})")
                await self.lease.ready()
                await self._note_done()
            _task(tasks, self.lease.follow(self.actions.carry_out, self.engine))
            if self.front is not None:
                # berthd's ladder waits for the requests in flight (issue 12 case 4): tell it.
                _task(tasks, job_reporter(self.front, self.lease, served_from).run())
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            return engine_exit.result() if engine_exit.done() else None

    async def _stop_after_error(self, exc_type, exc, tb) -> bool:
        """On the way out of an error (a bug, not a stop): the engine goes with the run, now,
        rather than when the watchdog sees the run gone. The error goes on."""
        if exc_type is not None and self.engine.running():
            log.error("stopping %s after an error: %r", self.o.engine, exc)
            with contextlib.suppress(Exception):
                await self.engine.kill()
        return False

    async def _stop(self, why: str) -> int:
        """The stop sequence: close the front, let in-flight requests finish (up to
        ``stop_grace_s``), SIGTERM the engine's group, SIGKILL after ``term_grace_s``, then
        release the lease once the driver confirms the memory free (up to
        ``release_wait_s``). Returns the engine's exit code."""
        why = self.actions.drained or why
        log.info("stopping %s (%s)", self.o.engine, why)
        if self.front is not None:
            # A drain for room lets the requests in flight finish, bounded by the engine's
            # max_job (berthd's quiet_s; issue 12 case 4); a plain stop gives them stop_grace.
            grace = max(self.o.stop_grace_s, self.actions.drain_quiet_s or 0.0)
            with contextlib.suppress(Exception):
                await self.front.close_and_drain(grace, why=f"the engine stops ({why})",
                                                 fence_at=self.actions.drain_fence_at)
            if not self._keeps():
                self.front.stopped(f"engine stopped: {why}")
        code = await self.engine.kill()
        await self.lease.report(Op.DRAIN, True, why, warn=False)
        await self.lease.release(why)
        return code
