"""The engine process of ``berth run``: spawn, health, and the end of its process group.

Source: issue 5; seed 002 rule 6 (Berth signals only the process group it started);
reference/llama-swap.md ("Consequences for a cmd wrapper").

- :meth:`EngineProcess.spawn`: pick a free port for the engine, put it in place of ``{port}``
  in the command, start the command without a shell in its own process group, with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES`` set to the granted cards (by
  UUID). The child gets a parent-death SIGKILL, and a watchdog (:mod:`berth.run.watchdog`) in its
  own session kills the engine's whole group when the run dies by any path, SIGKILL included.
- :meth:`EngineProcess.until_healthy`: poll ``--health`` (default ``/health``) until it answers,
  at the cadence of :mod:`berth.run.probe`.
- :meth:`EngineProcess.kill`: the engine's part of the stop sequence: SIGTERM the group, SIGKILL
  after ``term_grace_s``, then the group's stragglers; :meth:`EngineProcess.let_watchdog_go`
  at the end of every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

import aiohttp
from berth.process import ProcessId, SignalRefused, identify, signal_group
from berth.run import probe

if TYPE_CHECKING:                                   # the CLI builds the options and the run
    from berth.run.cli import RunOptions

__all__ = ["EngineProcess", "NoEngine", "free_port"]

log = logging.getLogger("berth.run")

_PR_SET_PDEATHSIG = 1
_SIGKILL_WAIT_S = 5.0
#: While an engine does not answer its health check: the first note after this many seconds,
#: then one every _HEALTH_NOTE_EVERY_S (a big model loads for minutes; silence looked hung).
_HEALTH_NOTE_FIRST_S = 10.0
_HEALTH_NOTE_EVERY_S = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def reaped(keep: set[int]) -> set[int]:
    """This run's descendants other than itself and the processes of ``keep`` (the engine's
    leader and the watchdog, which asyncio waits for): what the subreaper took in."""
    me = os.getpid()
    try:
        import psutil
        kids = psutil.Process(me).children(recursive=True)
    except Exception:                       # noqa: BLE001 (psutil's errors, a race)
        return set()
    return {k.pid for k in kids} - keep - {me}


def stop_reaped(keep: set[int], grace_s: float) -> int:
    """SIGTERM the processes the subreaper took in (:func:`reaped`), SIGKILL those left after
    ``grace_s``, and collect their exit (no zombie stays). Blocking: call it in a thread.
    Returns how many there were."""
    pids = reaped(keep)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + (grace_s if sig == signal.SIGTERM else _SIGKILL_WAIT_S)
        while pids and time.monotonic() < end:
            for pid in list(pids):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:   # not our child (a grandchild): gone or not ours
                    done = pid if not os.path.exists(f"/proc/{pid}") else 0
                if done:
                    pids.discard(pid)
            time.sleep(0.05)
        if not pids:
            break
    return len(pids)


class NoEngine(Exception):
    """The engine's command could not be started; ``code`` is the shell's (127, 126)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _fitted(cmd: list[str], cards: list[dict], env: dict[str, str]) -> list[str]:
    """``cmd`` with a llama-server in it bounded to the lease (:mod:`berth.run.fit`), each
    choice said in the run's log: the bound, a command left as written and why, a pinned
    context that needs more than the lease."""
    from berth.run import fit
    if fit.find_server(cmd) is None:
        return cmd
    why = fit.pinned(cmd, env)
    if why:
        log.info("llama-server left as written: %s", why)
    else:
        cmd, line = fit.bound(cmd, cards, env)
        if line:
            log.info("%s", line)
    over = fit.mismatch(cmd, cards, env)
    if over:
        log.warning("%s", over)
    return cmd


class EngineProcess:
    """The engine ``berth run`` starts: its process, identity (pid and start time), URL and
    watchdog. ``http`` is the session health checks use (the run opens and closes it)."""

    def __init__(self, opts: RunOptions):
        self.o = opts
        self.proc: asyncio.subprocess.Process | None = None
        self.ident: ProcessId | None = None
        self.url: str | None = None
        self.watchdog: asyncio.subprocess.Process | None = None
        self.http: aiohttp.ClientSession | None = None

    def running(self) -> bool:
        """Whether the engine was started and has not exited."""
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self, cards: list[dict], lease_id: str | None, driver: dict) -> ProcessId | None:
        """Start the engine on ``cards`` (the grant's ``{"uuid", …}``) and its watchdog. Returns
        the engine's identity as ``/proc`` gives it, or ``None`` if it could not be read (the
        run then does not attach it). Raises :class:`NoEngine` if the command cannot start."""
        port = free_port()
        cmd = [a.replace("{port}", str(port)) for a in self.o.cmd]
        if self.o.upstream:
            self.url = self.o.upstream.rstrip("/")
        elif any("{port}" in a for a in self.o.cmd):
            self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if cards:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(c["uuid"] for c in cards if c.get("uuid"))
        if lease_id:
            env["BERTH_LEASE"] = lease_id
        if driver.get("sim_dir"):
            env["BERTH_SIM_DIR"] = driver["sim_dir"]
        cmd = _fitted(cmd, cards, env)
        parent = os.getpid()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, preexec_fn=lambda: _child_setup(parent))
        except OSError as e:
            log.error("cannot start %s: %s: %s", self.o.engine, cmd[0], e.strerror or e)
            raise NoEngine(127 if isinstance(e, FileNotFoundError) else 126) from None
        ident = identify(self.proc.pid)
        self.ident = ident or ProcessId(self.proc.pid, time.time())
        log.info("started %s as pid %s: %s", self.o.engine, self.proc.pid, " ".join(cmd))
        self.watchdog = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "berth.run.watchdog", str(self.ident.pid),
            repr(self.ident.start_time), stdin=asyncio.subprocess.PIPE,
            start_new_session=True)
        return ident

    async def until_healthy(self, deadline_s: float | None = None) -> bool:
        """Poll the engine's health (``--health``, default ``/health``) until it answers 200.
        ``False`` if the engine exits first or ``deadline_s`` (seconds; ``None``: no limit)
        passes."""
        if self.o.health == "none" or not self.url:
            return True
        url = self.url + self.o.health
        began = time.monotonic()
        end = None if deadline_s is None else began + deadline_s
        note_at, last = began + _HEALTH_NOTE_FIRST_S, "no answer"
        cadence = probe.delays()     # shared with the policy simulator (issue 34)
        while end is None or time.monotonic() < end:
            if self.proc is not None and self.proc.returncode is not None:
                return False
            try:
                async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        return True
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                os_error = getattr(e, "os_error", None)
                last = (getattr(os_error, "strerror", None) or type(e).__name__).lower()
            if time.monotonic() >= note_at:
                log.info("%s has not answered GET %s with 200 for %.0f s (last: %s); requests "
                         "wait in the front meanwhile (--health names another path)",
                         self.o.engine, url, time.monotonic() - began, last)
                note_at = time.monotonic() + _HEALTH_NOTE_EVERY_S
            await asyncio.sleep(next(cadence))
        return False

    async def kill(self) -> int:
        """SIGTERM the engine's group, SIGKILL after ``term_grace_s``, wait for the leader,
        SIGKILL what is left of the group and let the watchdog go. Returns the exit code (0 if
        the engine never started; ``-N`` if a signal ended it)."""
        if self.proc is None or self.ident is None:
            return 0
        for sig, wait in ((signal.SIGTERM, self.o.term_grace_s), (signal.SIGKILL, _SIGKILL_WAIT_S)):
            if self.proc.returncode is not None:
                break
            try:
                signal_group(self.ident, sig)
            except (SignalRefused, ProcessLookupError):
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), wait)
        if self.proc.returncode is None:
            await self.proc.wait()
        # The leader is gone; stragglers of its group go too (the watchdog would do it anyway).
        with contextlib.suppress(SignalRefused, ProcessLookupError, PermissionError):
            signal_group(self.ident, signal.SIGKILL)
        # And what left the group but not the run (setsid, then re-parented to the run as its
        # subreaper): an engine's daemonized child holds the lease's memory too.
        keep = {self.proc.pid} | ({self.watchdog.pid} if self.watchdog is not None else set())
        await asyncio.to_thread(stop_reaped, keep, self.o.term_grace_s)
        await self.let_watchdog_go()
        return self.proc.returncode

    async def let_watchdog_go(self, wait_s: float = _SIGKILL_WAIT_S) -> None:
        """Close the watchdog's pipe, as the run's exit would: it kills what is left of the
        engine's group and exits; wait for that (``wait_s`` seconds at most), so no watchdog
        outlives the run's event loop."""
        w = self.watchdog
        if w is None:
            return
        if w.stdin is not None and not w.stdin.is_closing():
            w.stdin.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(w.wait(), wait_s)
