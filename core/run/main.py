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
   release with a driver read (rule 1); the run's word is never proof.
5. On SIGTERM/SIGINT (llama-swap's stop): close the front, wait for in-flight requests up to a
   grace, SIGTERM the engine's group, then SIGKILL, wait for the driver to confirm the memory
   free, release the lease, exit with the engine's code. The defaults fit llama-swap's
   ``unloadTimeout`` of 10 s (1 s + 4 s + 3 s + a little).

The engine never outlives the run: the child gets a parent-death SIGKILL, and a watchdog in its
own session kills the engine's whole group when the run dies by any path, SIGKILL included.

It fails open: if berthd is down at start, the engine runs unleased (with a warning) and the
front forwards; if berthd dies later, the front keeps forwarding, and the run re-attaches when
berthd is back (or asks for a new lease if berthd lost the old one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING

import aiohttp
from berth.decide.model import Op
from berth.front import Front
from berth.run.actions import Actions
from berth.run.engine import EngineProcess, NoEngine
from berth.run.lease import LeaseClient
from berth.run.waits import job_reporter

from berth_plugins.manager import is_write, make_plugin_manager

if TYPE_CHECKING:                                   # the CLI builds the options and the run
    from berth.run.cli import RunOptions

__all__ = ["EngineRun"]

log = logging.getLogger("berth.run")


class EngineRun:
    """One run of one engine: its front, lease, engine process and actions. :meth:`main`
    returns the exit code."""

    def __init__(self, opts: RunOptions):
        self.o = opts
        self.stop_event = asyncio.Event()
        self.lease = LeaseClient(opts, self.stop_event)
        self.engine = EngineProcess(opts)
        self.front: Front | None = None
        self.actions: Actions | None = None

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.engine.http = aiohttp.ClientSession()
        try:
            return await self._main()
        finally:
            await self.engine.http.close()
            await self.lease.close()
            if self.front is not None:
                await self.front.stop()

    async def _main(self) -> int:
        pm = make_plugin_manager()
        if self.o.front:
            host, _, port = self.o.front.rpartition(":")
            self.front = Front(host or "127.0.0.1", int(port), name=self.o.engine,
                               wait_limit_s=self.lease.limit("wait_limit_s"),
                               on_wake=self.lease.on_wake, on_activity=self.lease.on_activity,
                               is_write=lambda m, p: is_write(pm, self.o.engine, m, p),
                               max_in_flight=self.o.max_in_flight,
                               on_unwanted=self.lease.on_unwanted)
            try:
                await self.front.start()
            except OSError as e:
                log.error("cannot listen on the front %s: %s", self.o.front, e.strerror or e)
                self.front = None
                return 2
        self.lease.front = self.front
        self.lease.waits.front = self.front
        self.actions = Actions(self.o, pm, self.lease, self.engine, self.front, self.stop_event)
        granted = await self.lease.acquire()
        if granted is None:
            return 143 if self.stop_event.is_set() else 1
        try:
            ident = await self.engine.spawn(self.lease.cards, self.lease.lease_id,
                                             self.lease.driver)
        except NoEngine as e:
            if self.front is not None:
                self.front.stopped("the engine could not be started")
            await self.lease.release("the engine could not be started")
            return e.code
        await self.lease.attach(ident)
        if self.front is not None and self.engine.url:
            self.front.set_upstream(self.engine.url)
        engine_exit = asyncio.create_task(self.engine.proc.wait())
        stop = asyncio.create_task(self.stop_event.wait())
        done = await self._until_serving(engine_exit, stop)
        instr = asyncio.create_task(self.lease.follow(self.actions.carry_out, self.engine))
        # berthd's ladder waits for the requests in flight (issue 12 case 4): tell it.
        jobs = asyncio.create_task(job_reporter(self.front, self.lease).run()) \
            if self.front is not None else None
        try:
            if engine_exit not in done and stop not in done:
                await asyncio.wait({engine_exit, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (instr, jobs):
                if t is not None:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
        if engine_exit.done():
            code = engine_exit.result()
            log.info("%s exited on its own with %s", self.o.engine, code)
            if self.front is not None:
                self.front.stopped("engine exited")
            await self.lease.release("engine exited")
            return code
        return await self._stop("stop signal")

    async def _until_serving(self, engine_exit: asyncio.Task, stop: asyncio.Task) -> set:
        """Wait for the engine's health (or its exit, or a stop); once it answers, open the
        front and tell berthd it serves. Returns the tasks that finished."""
        proc = self.engine.proc
        healthy = asyncio.create_task(self.engine.until_healthy())
        done, _ = await asyncio.wait({engine_exit, stop, healthy},
                                     return_when=asyncio.FIRST_COMPLETED)
        if healthy in done and healthy.result():
            if self.front is not None:
                self.front.open()
            log.info("%s is serving%s", self.o.engine,
                     f" on {self.engine.url}" if self.engine.url else f" (pid {proc.pid})")
            await self.lease.ready()
        elif not healthy.done():
            healthy.cancel()
        return done

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
                await self.front.close_and_drain(grace, why=f"the engine stops ({why})")
            self.front.stopped(f"engine stopped: {why}")
        code = await self.engine.kill()
        await self.lease.report(Op.DRAIN, True, why, warn=False)
        await self.lease.release(why)
        return code
