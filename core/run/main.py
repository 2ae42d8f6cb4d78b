"""``berth run``: one engine run under a lease, behind its own front.

Source: issue 5; seed 002 "Fronts", rule 3, "Why the run owns the front for a routed engine",
stage A1; reference/llama-swap.md ("Consequences for a cmd wrapper").

    berth run [--engine NAME] [--front HOST:PORT] [--size SIZE[@CARD]]… [--priority N]
              [--park checkpoint|hook] [--adapter NAME] [--lend [--lend-max SIZE]] -- CMD…

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

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from berth.client import ApiError, BerthdUnavailable, Client
from berth.process import ProcessId, SignalRefused, identify, signal_group, tree_pids
from berth.decide.units import parse_duration, parse_size

__all__ = ["register", "RunOptions", "EngineRun", "parse_sizes"]

log = logging.getLogger("berth.run")


@dataclass
class RunOptions:
    """``berth run``'s options. Durations in seconds."""

    cmd: list[str]
    engine: str
    sizes: list[tuple[str | None, str]] = field(default_factory=list)
    front: str | None = None
    upstream: str | None = None
    priority: int | None = None
    park: str | None = None
    adapter: str | None = None
    lend: bool = False
    lend_max: str | None = None
    bound: str | None = None
    health: str = "/health"
    checkpoint_path: str | None = None
    stop_grace_s: float = 1.0
    term_grace_s: float = 4.0
    release_wait_s: float = 3.0
    # None: use berthd's [policy] values (sent with the grant); 120 s / 20 s / 60 s without one.
    wait_limit_s: float | None = None
    max_in_flight: int | None = None
    release_grace_s: float | None = None
    wake_limit_s: float | None = None
    require_berthd: bool = False
    options: dict = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)


def parse_sizes(values: list[str]) -> list[tuple[str | None, str]]:
    """``["10GiB@gpu0", "card"]`` -> ``[("gpu0", "10GiB"), (None, "card")]``. Raises
    ``ValueError`` naming ``--size`` and the value."""
    out = []
    for v in values:
        size, _, card = v.partition("@")
        parse_size(size, field="--size", allow_card=True)
        if _ and not card:
            raise ValueError(f"--size: expected SIZE[@CARD], got {v!r}")
        out.append((card or None, size))
    return out


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1


def _child_setup(parent: int) -> None:
    """In the child, before exec: lead a new process group, die with the parent."""
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:       # the run died before prctl took effect
        os._exit(1)


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to finish (its cleanup runs: a tool it ran is killed)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _NoEngine(Exception):
    """The engine's command could not be started; ``code`` is the shell's (127, 126)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Busy(RuntimeError):
    """The front could not go quiet in time: the park never began."""


class EngineRun:
    """One run of one engine. :meth:`main` returns the exit code."""

    def __init__(self, opts: RunOptions):
        self.o = opts
        self.client = Client()
        self.lease_id: str | None = None
        self.cards: list[dict] = []
        self.driver: dict = {}
        self.proc: asyncio.subprocess.Process | None = None
        self.engine_id: ProcessId | None = None
        self.engine_url: str | None = None
        self.front = None
        self.pm = None
        self.watchdog: asyncio.subprocess.Process | None = None
        self.stop_event = asyncio.Event()
        self.after_seq = 0
        self.pids: list[int] = []
        self.use: dict[str, int | None] = {}
        self.ram_available: int | None = None
        self.leased = False
        self._http: aiohttp.ClientSession | None = None
        self._touching = False
        self._drained: str | None = None
        self.policy: dict = {}

    # -- entry ---------------------------------------------------------------------------------
    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self._http = aiohttp.ClientSession()
        try:
            return await self._main()
        finally:
            await self._http.close()
            await self.client.close()
            if self.front is not None:
                await self.front.stop()

    _DEFAULT_LIMITS = {"wait_limit_s": 120.0, "release_grace_s": 20.0, "wake_limit_s": 60.0}

    def _limit(self, name: str) -> float:
        """A time limit in seconds: the run line's own, else berthd's [policy], else the
        default."""
        mine = getattr(self.o, name)
        if mine is not None:
            return mine
        return float(self.policy.get(name) or self._DEFAULT_LIMITS[name])

    async def _main(self) -> int:
        from berth_plugins.manager import make_plugin_manager
        self.pm = make_plugin_manager()
        if self.o.front:
            from berth.front import Front
            host, _, port = self.o.front.rpartition(":")
            from berth_plugins.manager import is_write
            self.front = Front(host or "127.0.0.1", int(port), name=self.o.engine,
                               wait_limit_s=self._limit("wait_limit_s"), on_wake=self._on_wake,
                               on_activity=self._on_activity,
                               is_write=lambda m, p: is_write(self.pm, self.o.engine, m, p),
                               max_in_flight=self.o.max_in_flight,
                               on_unwanted=self._on_unwanted)
            try:
                await self.front.start()
            except OSError as e:
                log.error("cannot listen on the front %s: %s", self.o.front, e.strerror or e)
                self.front = None
                return 2
        granted = await self._lease()
        if granted is None:
            return 143 if self.stop_event.is_set() else 1
        try:
            await self._spawn()
        except _NoEngine as e:
            if self.front is not None:
                self.front.stopped("the engine could not be started")
            await self._release("the engine could not be started")
            return e.code
        engine_exit = asyncio.create_task(self.proc.wait())
        stop = asyncio.create_task(self.stop_event.wait())
        healthy = asyncio.create_task(self._until_healthy())
        done, _ = await asyncio.wait({engine_exit, stop, healthy}, return_when=asyncio.FIRST_COMPLETED)
        if healthy in done and healthy.result():
            self._open()
            log.info("%s is serving%s", self.o.engine,
                     f" on {self.engine_url}" if self.engine_url else f" (pid {self.proc.pid})")
            await self._ready()
        elif not healthy.done():
            healthy.cancel()
        instr = asyncio.create_task(self._instructions())
        try:
            if engine_exit not in done and stop not in done:
                await asyncio.wait({engine_exit, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            instr.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await instr
        if engine_exit.done():
            code = engine_exit.result()
            log.info("%s exited on its own with %s", self.o.engine, code)
            if self.front is not None:
                self.front.stopped("engine exited")
            await self._release("engine exited")
            return code
        return await self._stop("stop signal")

    # -- the lease -----------------------------------------------------------------------------
    def _body(self) -> dict:
        o = self.o
        body: dict = {"engine": o.engine, "owner_pid": os.getpid(), "lend": o.lend}
        if o.sizes:
            body["shares"] = [{"card": c, "size": s} for c, s in o.sizes]
        if o.front:
            body["front"] = o.front
        if o.aliases:
            body["aliases"] = list(o.aliases)
        if o.park:
            body["park"] = o.park
        if o.lend_max:
            body["lend_max"] = o.lend_max
        if o.priority is not None:
            body["priority"] = o.priority
        if o.bound:
            body["bound"] = o.bound
        return body

    async def _lease(self) -> dict | None:
        """Request the lease and wait for the grant. ``None``: stopped or refused. With berthd
        unreachable, returns ``{}`` and the run goes on unleased (fails open)."""
        said = False
        while True:
            try:
                r = await self.client.request_lease(self._body())
                break
            except BerthdUnavailable as e:
                if not self.o.require_berthd:
                    log.warning("%s; running %s UNLEASED (fail-open): Berth cannot protect this "
                                "card until berthd is back (--require-berthd waits instead)",
                                e, self.o.engine)
                    return {}
                if not said:
                    log.warning("%s; waiting for it (--require-berthd)", e)
                    said = True
                try:
                    await asyncio.wait_for(self.stop_event.wait(), 1.0)
                    return None
                except TimeoutError:
                    continue
            except ApiError as e:
                log.error("berthd refused the lease: %s", e.message)
                return None
        self.lease_id = r["id"]
        self.policy = r.get("policy") or {}
        if self.front is not None:
            self.front.wait_limit_s = self._limit("wait_limit_s")
        log.info("lease %s requested (%s)", self.lease_id, r["state"])
        while not self.stop_event.is_set():
            wait = asyncio.create_task(self._grant_once())
            stop = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                wait.cancel()
                break
            stop.cancel()
            g = wait.result()
            if g is None:
                continue
            if g.get("gone"):
                log.error("lease %s: %s", self.lease_id, g["gone"])
                return None
            self.cards = g["cards"]
            self.driver = g.get("driver") or {}
            self.policy = g.get("policy") or {}
            if self.front is not None:
                self.front.wait_limit_s = self._limit("wait_limit_s")
            self.leased = True
            log.info("lease %s granted: %s (%s)", self.lease_id,
                     ", ".join(f"{c['name']}={c['bytes']}" for c in self.cards), g.get("rung"))
            return g
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self.client.release(self.lease_id, 0, "stopped while waiting")
        if self.front is not None:
            self.front.stopped("stopped while waiting for a lease")
        return None

    async def _grant_once(self) -> dict | None:
        try:
            g = await self.client.wait_grant(self.lease_id, 20.0)
        except BerthdUnavailable:
            await asyncio.sleep(1.0)
            return None
        except ApiError as e:
            if e.status in (404, 410):
                return {"gone": e.message}
            raise
        return g if g.get("granted") else None

    async def _release(self, why: str) -> None:
        if not self.lease_id:
            return
        try:
            r = await self.client.release(self.lease_id, self.o.release_wait_s, why)
            if not r.get("ended"):
                log.warning("lease %s: memory not confirmed free within %.1fs; berthd keeps "
                            "watching it", self.lease_id, self.o.release_wait_s)
        except (BerthdUnavailable, ApiError) as e:
            log.warning("could not release lease %s: %s", self.lease_id, e)

    # -- the engine ----------------------------------------------------------------------------
    async def _spawn(self) -> None:
        port = _free_port()
        cmd = [a.replace("{port}", str(port)) for a in self.o.cmd]
        if self.o.upstream:
            self.engine_url = self.o.upstream.rstrip("/")
        elif any("{port}" in a for a in self.o.cmd):
            self.engine_url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if self.cards:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(c["uuid"] for c in self.cards if c.get("uuid"))
        if self.lease_id:
            env["BERTH_LEASE"] = self.lease_id
        if self.driver.get("sim_dir"):
            env["BERTH_SIM_DIR"] = self.driver["sim_dir"]
        parent = os.getpid()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, preexec_fn=lambda: _child_setup(parent))
        except OSError as e:
            log.error("cannot start %s: %s: %s", self.o.engine, cmd[0], e.strerror or e)
            raise _NoEngine(127 if isinstance(e, FileNotFoundError) else 126) from None
        ident = identify(self.proc.pid)
        self.engine_id = ident or ProcessId(self.proc.pid, time.time())
        log.info("started %s as pid %s: %s", self.o.engine, self.proc.pid, " ".join(cmd))
        self.watchdog = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "berth.run.watchdog", str(self.engine_id.pid),
            repr(self.engine_id.start_time), stdin=asyncio.subprocess.PIPE,
            start_new_session=True)
        if self.lease_id and ident is not None:
            try:
                await self.client.attach(self.lease_id, ident.pid, ident.start_time)
            except (BerthdUnavailable, ApiError) as e:
                log.warning("attach of pid %s failed: %s", ident.pid, e)
        if self.front is not None and self.engine_url:
            self.front.set_upstream(self.engine_url)

    async def _until_healthy(self, deadline_s: float | None = None) -> bool:
        """Poll the engine's health (``--health``, default ``/health``) until it answers 200."""
        if self.o.health == "none" or not self.engine_url:
            return True
        url = self.engine_url + self.o.health
        end = None if deadline_s is None else time.monotonic() + deadline_s
        delay = 0.05
        while end is None or time.monotonic() < end:
            if self.proc is not None and self.proc.returncode is not None:
                return False
            try:
                async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        return True
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        return False

    def _open(self) -> None:
        if self.front is not None:
            self.front.open()

    async def _ready(self) -> None:
        """Tell berthd the engine answers: its minimum turn starts now."""
        if self.lease_id:
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.ready(self.lease_id)

    # -- instructions --------------------------------------------------------------------------
    async def _instructions(self) -> None:
        """Long-poll berthd for instructions and carry them out, one at a time. Survives berthd
        restarts; asks for a new lease if berthd lost this one.

        Polling goes on while an action runs: a drain calls off the park, wake, lend or return
        in progress and stops the engine at once (rule 4: berthd's release grace and wake limit
        decide when, not the run's own action timeouts, which may be longer)."""
        queued: list[dict] = []
        worker: asyncio.Task | None = None

        async def work() -> None:
            while queued:
                await self._carry_out(queued.pop(0))

        backoff = 0.5
        try:
            while True:
                if not self.lease_id:
                    await self._reconnect()
                    continue
                try:
                    r = await self.client.instructions(self.lease_id, self.after_seq, 20.0)
                    backoff = 0.5
                except BerthdUnavailable:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                except ApiError as e:
                    if e.status in (404, 410):
                        log.warning("berthd no longer knows lease %s (%s); asking for a new one",
                                    self.lease_id, e.message)
                        self.lease_id = None
                        continue
                    # Any other refusal must not end the loop (the run would stop hearing
                    # drains) nor escape into the stop sequence: say it and poll again.
                    log.error("berthd refused the instruction poll: %s; polling again", e)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                self.pids = r.get("pids") or []
                self.use = r.get("use") or {}
                self.ram_available = r.get("ram_available_bytes")
                for ins in r["instructions"]:
                    self.after_seq = max(self.after_seq, ins["seq"])
                    if ins["op"] == "drain":
                        queued.clear()
                        if worker is not None and not worker.done():
                            log.info("a drain calls off the action in progress")
                            await _cancel(worker)
                        await self._carry_out(ins)
                        continue
                    queued.append(ins)
                    if worker is None or worker.done():
                        worker = asyncio.create_task(work())
                if r.get("ended"):
                    log.info("lease %s ended (%s)", self.lease_id, r["ended"])
                    return
        finally:
            if worker is not None:
                await _cancel(worker)

    async def _reconnect(self) -> None:
        """berthd is back without our lease (or was down at start): lease the running engine.
        The request adopts it (pid and start time; the run is its parent), so berthd counts the
        memory it already holds as the waiting lease's own, not as a stowaway's that would leave
        no room for it. A refusal leaves the run serving unleased; it asks again later."""
        body = self._body()
        if self.engine_id is not None and self.proc is not None and self.proc.returncode is None:
            body["pid"], body["start_time"] = self.engine_id.pid, self.engine_id.start_time
        try:
            r = await self.client.request_lease(body)
        except BerthdUnavailable:
            await asyncio.sleep(2.0)
            return
        except ApiError as e:
            log.warning("berthd refused to lease the running %s: %s; still UNLEASED, asking "
                        "again in 5 s", self.o.engine, e.message)
            await asyncio.sleep(5.0)
            return
        self.lease_id = r["id"]
        while True:
            g = await self._grant_once()
            if g is not None:
                break
        if g.get("gone"):
            self.lease_id = None
            return
        self.cards = g["cards"]
        if self.engine_id is not None:
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.attach(self.lease_id, self.engine_id.pid, self.engine_id.start_time)
            await self._ready()
        log.info("re-attached %s as lease %s", self.o.engine, self.lease_id)

    def _ctx(self, op: str, ins: dict):
        from berth_plugins.hookspecs import ActionContext
        mech = self.o.park if op in ("park", "wake") else "protocol"
        if op in ("park", "wake") and self.o.park == "hook":
            mech = self.o.adapter or "protocol"
        if op in ("lend", "return"):
            mech = self.o.adapter or "protocol"
        pids = list(self.pids) or (sorted(tree_pids(self.engine_id.pid)) if self.engine_id else [])
        opts = dict(self.o.options)
        if self.o.checkpoint_path:
            opts["checkpoint_path"] = self.o.checkpoint_path
        timeout = self._limit("release_grace_s") if op in ("park", "lend") \
            else self._limit("wake_limit_s")
        return ActionContext(engine=self.o.engine, mechanism=mech, engine_url=self.engine_url,
                             pid=self.engine_id.pid if self.engine_id else None,
                             start_time=self.engine_id.start_time if self.engine_id else None,
                             pids=pids, cards=list(ins.get("cards") or []),
                             bytes={k: int(v) for k, v in (ins.get("bytes") or {}).items()},
                             use_bytes=dict(self.use), ram_available_bytes=self.ram_available,
                             room_confirmed=op in ("wake", "return"), timeout_s=timeout,
                             options=opts)

    async def _carry_out(self, ins: dict) -> None:
        from berth_plugins.manager import run_action
        op = ins["op"]
        log.info("instruction %s (%s)", op, ins.get("reason", ""))
        if op == "drain":
            self.stop_event.set()
            self._drained = ins.get("reason", "drained")
            return
        ok, detail = True, ""
        try:
            if op in ("park", "lend"):
                if self.front is not None:
                    quiet = await self.front.close_and_drain(self._limit("release_grace_s"))
                    if not quiet:
                        self.front.open()
                        # "busy": the engine was never touched; berthd calls the park off when
                        # nothing waits for the room, else falls back (rule 4).
                        raise _Busy("busy: in-flight requests did not finish within the grace")
                await run_action(self.pm, f"berth_{op}", self._ctx(op, ins))
                if self.front is not None:
                    if op == "park":
                        self.front.sleep()
                    else:
                        self.front.open()
            elif op in ("wake", "return"):
                await run_action(self.pm, f"berth_{op}" if op == "wake" else "berth_return",
                                 self._ctx(op, ins))
                if op == "wake":
                    if not await self._until_healthy(self._limit("wake_limit_s")):
                        raise RuntimeError("the engine did not answer its health check after the wake")
                    self._open()
        except _Busy as e:
            ok, detail = False, str(e)
        except Exception as e:                          # reported; berthd falls back (rule 4)
            ok, detail = False, f"{type(e).__name__}: {e}"
            log.error("%s failed: %s", op, detail)
            if self.front is not None:
                if op == "wake":
                    self.front.fail_held(f"wake failed: {e}")
                    with contextlib.suppress(Exception):
                        self.front.sleep()
                elif op in ("lend", "park") and self.front.state.value == "closing":
                    self.front.open()
        try:
            await self.client.report(self.lease_id, op, ok, detail)
        except (BerthdUnavailable, ApiError) as e:
            log.warning("could not report %s to berthd: %s", op, e)

    async def _on_wake(self) -> None:
        """The front holds a write for the sleeping engine: ask berthd to resume the lease."""
        if not self.lease_id:
            raise RuntimeError("berthd is unavailable, so the engine cannot be woken safely")
        try:
            await self.client.wake(self.lease_id)
        except BerthdUnavailable as e:
            raise RuntimeError(f"berthd is unavailable ({e}); the engine stays parked") from None

    def _on_unwanted(self) -> None:
        """The last request held for a wake gave up: withdraw the wake, unless it is under way,
        so it does not later displace an engine in use for nobody."""
        if not self.lease_id or self.front is None:
            return

        async def withdraw():
            try:
                r = await self.client.call("DELETE", f"/v1/leases/{self.lease_id}/wake")
            except (BerthdUnavailable, ApiError):
                return
            if r.get("withdrawn") and self.front is not None and self.front.holding == 0:
                with contextlib.suppress(Exception):
                    self.front.sleep()
                log.info("the requests that asked for the wake have gone; it stays parked")
        asyncio.get_running_loop().create_task(withdraw())

    def _on_activity(self) -> None:
        if not self.lease_id or self._touching:
            return
        self._touching = True

        async def touch():
            try:
                with contextlib.suppress(BerthdUnavailable, ApiError):
                    await self.client.touch(self.lease_id)
            finally:
                self._touching = False
        asyncio.get_running_loop().create_task(touch())

    # -- stopping ------------------------------------------------------------------------------
    async def _stop(self, why: str) -> int:
        """Close the front, let in-flight requests finish (up to ``stop_grace_s``), SIGTERM the
        engine's group, SIGKILL after ``term_grace_s``, then release the lease once the driver
        confirms the memory free (up to ``release_wait_s``). Returns the engine's exit code."""
        why = self._drained or why
        log.info("stopping %s (%s)", self.o.engine, why)
        if self.front is not None:
            with contextlib.suppress(Exception):
                await self.front.close_and_drain(self.o.stop_grace_s)
            self.front.stopped(f"engine stopped: {why}")
        code = await self._kill_engine()
        if self.lease_id:
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.report(self.lease_id, "drain", True, why)
        await self._release(why)
        return code

    async def _kill_engine(self) -> int:
        if self.proc is None or self.engine_id is None:
            return 0
        for sig, wait in ((signal.SIGTERM, self.o.term_grace_s), (signal.SIGKILL, 5.0)):
            if self.proc.returncode is not None:
                break
            try:
                signal_group(self.engine_id, sig)
            except (SignalRefused, ProcessLookupError):
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), wait)
        if self.proc.returncode is None:
            await self.proc.wait()
        # The leader is gone; stragglers of its group go too (the watchdog would do it anyway).
        with contextlib.suppress(SignalRefused, ProcessLookupError, PermissionError):
            signal_group(self.engine_id, signal.SIGKILL)
        if self.watchdog is not None and self.watchdog.stdin is not None:
            self.watchdog.stdin.close()
        return self.proc.returncode


def _positive(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    v = parse_duration(text, field=flag)
    if v <= 0:
        raise ValueError(f"{flag}: must be more than 0 seconds, got {text!r}")
    return v


def _check_front(front: str) -> None:
    """``HOST:PORT`` with a port of 1–65535 (IPv6 as ``[::1]:PORT``). Raises ``ValueError``."""
    host, sep, port = front.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--front: expected HOST:PORT with a port of 1-65535, got {front!r}")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"--front: unbalanced brackets in {front!r}")


def _check_checkpoint(path: str | None) -> None:
    """The cuda-checkpoint a checkpoint park will run must exist now, not at the first park
    (a missing tool would turn that park into a drain). Raises ``ValueError``."""
    import shutil
    tool = path or os.environ.get("BERTH_CUDA_CHECKPOINT") or "cuda-checkpoint"
    first = tool.split()[0]
    if shutil.which(first) is None:
        raise ValueError(f"--park checkpoint: cannot find {first!r} (give --checkpoint-path, set "
                         f"BERTH_CUDA_CHECKPOINT, or put NVIDIA's cuda-checkpoint on PATH; with "
                         f"simulated cards use berth-sim-cuda-checkpoint)")


def _cmd_run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    name = args.engine or (os.path.basename(cmd[0]) if cmd else "?")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s berth run[{name}] %(levelname)s: %(message)s")
    if not cmd:
        print("berth run: give the engine's command after --", file=sys.stderr)
        return 2
    try:
        if args.front:
            _check_front(args.front)
        options = {}
        for o in args.option or []:
            key, eq, value = o.partition("=")
            if not eq or not key:
                raise ValueError(f"--option: expected KEY=VALUE, got {o!r}")
            options[key] = value
        if args.park == "checkpoint":
            _check_checkpoint(args.checkpoint_path)
        sizes = parse_sizes(args.size or [])
        if args.lend_max:
            parse_size(args.lend_max, field="--lend-max")
        opts = RunOptions(
            cmd=cmd, engine=args.engine or os.path.basename(cmd[0]), sizes=sizes,
            front=args.front, upstream=args.upstream, priority=args.priority, park=args.park,
            adapter=args.adapter, lend=args.lend, lend_max=args.lend_max, bound=args.bound,
            health=args.health, checkpoint_path=args.checkpoint_path,
            wait_limit_s=_positive(args.wait_limit, "--wait-limit"),
            max_in_flight=args.max_in_flight,
            stop_grace_s=parse_duration(args.stop_grace, field="--stop-grace"),
            term_grace_s=parse_duration(args.term_grace, field="--term-grace"),
            release_grace_s=_positive(args.release_grace, "--release-grace"),
            wake_limit_s=_positive(args.wake_limit, "--wake-limit"),
            require_berthd=args.require_berthd, options=options, aliases=args.alias or [])
        if args.max_in_flight is not None and args.max_in_flight < 1:
            raise ValueError(f"--max-in-flight: must be at least 1, got {args.max_in_flight}")
    except ValueError as e:
        print(f"berth run: {e}", file=sys.stderr)
        return 2
    if opts.front and not opts.upstream and not any("{port}" in a for a in cmd):
        print("berth run: with --front, the engine's command must contain {port} (the port the "
              "run picks) or give --upstream URL", file=sys.stderr)
        return 2
    if opts.park and not opts.front:
        print("berth run: --park needs --front (rule 3: an engine sleeps only behind a front)",
              file=sys.stderr)
        return 2
    code = asyncio.run(EngineRun(opts).main())
    # An engine killed by a signal has returncode -N; exit 128 + N as a shell reports it
    # (sys.exit(-9) would exit 247).
    return 128 - code if code < 0 else code


def register(sub) -> None:
    p = sub.add_parser("run", help="run an engine under a lease, behind its own front",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--engine", help="engine name (default: the command's name)")
    p.add_argument("--front", metavar="HOST:PORT", help="where clients reach the engine")
    p.add_argument("--alias", action="append", metavar="ID",
                   help="another model ID the gateway routes to this engine (repeatable)")
    p.add_argument("--upstream", metavar="URL", help="the engine's own URL when CMD has no {port}")
    p.add_argument("--size", action="append", metavar="SIZE[@CARD]",
                   help="memory per card, e.g. 14GiB@gpu0 or card (repeat for several cards)")
    p.add_argument("--priority", type=int)
    p.add_argument("--park", choices=("checkpoint", "hook"))
    p.add_argument("--adapter", help="the hook's adapter: protocol, vllm, sglang, llamacpp")
    p.add_argument("--lend", action="store_true", help="the engine can lend memory (protocol)")
    p.add_argument("--lend-max", metavar="SIZE",
                   help="the most it may lend on one card (default: its share less its measured "
                        "use, which is about nothing for an engine that preallocates its KV cache)")
    p.add_argument("--bound", choices=("declared", "current", "growth"))
    p.add_argument("--health", default="/health", help="the engine's health path, or 'none'")
    p.add_argument("--checkpoint-path", help="cuda-checkpoint to use (default: on PATH, or "
                                             "$BERTH_CUDA_CHECKPOINT)")
    p.add_argument("--wait-limit", help="longest a request is held (default: berthd's "
                                        "[policy] wait_limit, else 120s)")
    p.add_argument("--max-in-flight", type=int, metavar="N",
                   help="forward at most N requests at once (the engine's parallel slots); the "
                        "rest wait in the front, so a park waits only for running requests")
    p.add_argument("--stop-grace", default="1s", help="in-flight grace on stop (default 1s)")
    p.add_argument("--term-grace", default="4s", help="SIGTERM to SIGKILL (default 4s)")
    p.add_argument("--release-grace", help="park/lend time limit (default: berthd's [policy])")
    p.add_argument("--wake-limit", help="wake/return time limit (default: berthd's [policy])")
    p.add_argument("--require-berthd", action="store_true",
                   help="wait for berthd instead of running the engine unleased (fail-open) "
                        "when it cannot be reached")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a mechanism option (e.g. model=ID for llama.cpp's router)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    p.set_defaults(func=_cmd_run)
