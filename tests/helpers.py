"""Helpers every test folder shares: one poll with a deadline, and one way to stop what a test
started (its process groups killed and reaped, then a sweep of what they left).

Nothing sleeps to synchronise: a wait polls an observable condition until a deadline, and the
deadline only bounds a failure (a passing test returns as soon as the condition holds).

Every process the suite starts carries ``BERTH_TEST_RUN`` (a token made once per pytest run; an
xdist worker's children carry ``TOKEN/WORKER``): :func:`sweep_run` finds them by it when pytest
itself is stopped by SIGTERM (tests/conftest.py).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

__all__ = ["wait_for", "slowness", "ceiling", "ours", "sweep", "stop_group", "stop_all",
           "sweep_run", "run_marks", "RUN_ENV", "Lazy", "openai", "playwright"]

class Lazy:
    """A module imported at the first use of one of its attributes: every xdist worker
    collects every test module, so a test module's own imports are paid ten times over (the
    openai SDK's, with its hundreds of pydantic models, cost a worker about 0.4 CPU-s); one
    imported lazily is paid by the workers that run a test using it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib
        return getattr(importlib.import_module(self._name), attr)


#: ``openai``, imported at first use (:class:`Lazy`).
openai = Lazy("openai")
#: ``playwright.sync_api``, imported at first use (:class:`Lazy`).
playwright = Lazy("playwright.sync_api")

#: The environment variable naming one pytest run (its value: a random token).
RUN_ENV = "BERTH_TEST_RUN"


#: The most :func:`slowness` reports: past it a machine is not slow but stuck, and a ceiling
#: ten times its quiet value is already generous.
SLOWNESS_MAX = 10.0
#: CPU seconds :func:`slowness` burns to measure (longer than a scheduler's time slice, so a
#: busy machine shows in it), and how long one measure stands in a process: each of the ten
#: workers asked as each test started, so measured every 10 s they burnt 10 CPU-s of a suite
#: run's 620 (1.6 %) for ceilings that only bound failures.
_PROBE_CPU_S, _PROBE_EVERY_S = 0.03, 30.0
_probe = {"at": -_PROBE_EVERY_S, "factor": 1.0}


def slowness() -> float:
    """How many times slower than a quiet machine CPU work runs here now: the wall seconds a
    fixed burn of :data:`_PROBE_CPU_S` CPU seconds takes, over that CPU time (issue 38: deadlines
    scale by the machine's measured slowness). 1.0 on a quiet machine, about 3 to 6 with eight
    busy processes beside the suite on two cores; at least 1, at most :data:`SLOWNESS_MAX`.
    Measured at most once per :data:`_PROBE_EVERY_S` seconds in a process (a measure costs
    ``_PROBE_CPU_S`` times the slowness in wall time)."""
    now = time.monotonic()
    if now - _probe["at"] < _PROBE_EVERY_S:
        return _probe["factor"]
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu0 < _PROBE_CPU_S:
        pass
    ratio = (time.perf_counter() - wall0) / max(1e-9, time.thread_time() - cpu0)
    _probe.update(at=time.monotonic(), factor=min(SLOWNESS_MAX, max(1.0, ratio)))
    return _probe["factor"]


def ceiling(seconds: float) -> float:
    """``seconds`` (a deadline that bounds a failure on a quiet machine) scaled by
    :func:`slowness`."""
    return seconds * slowness()


#: After this many seconds a wait polls every :data:`_SLOW_POLL_S` at most: most long waits are
#: for an engine to load or a park to end (seconds), and each poll of berthd's board costs it
#: and the test together about a millisecond of CPU, which the suite's other tests lack.
_FAST_POLL_FOR_S, _SLOW_POLL_S = 1.0, 0.2


def wait_for(check, timeout_s: float = 60.0, what: str = "condition", every_s: float = 0.05):
    """Call ``check()`` every ``every_s`` seconds (every :data:`_SLOW_POLL_S` once it has waited
    :data:`_FAST_POLL_FOR_S`, unless ``every_s`` is longer) until it returns something truthy,
    and return that. Raises ``AssertionError`` once ``timeout_s`` seconds scaled by the
    machine's :func:`slowness` (measured when ``timeout_s`` has passed) have passed, naming
    ``what`` and the last value. The deadline bounds a failure, it does not measure speed: a
    passing wait returns as soon as its condition holds (within a poll). Most checks ask berthd
    for its whole board, so the poll is not faster than 20 a second: the suite runs several
    tests at once."""
    start = time.monotonic()
    limit = timeout_s
    while True:
        last = check()
        if last:
            return last
        waited = time.monotonic() - start
        if waited > limit:
            limit = max(limit, ceiling(timeout_s))
            if waited > limit:
                raise AssertionError(f"timed out after {waited:.1f}s ({timeout_s:g}s scaled "
                                     f"by the machine's slowness) waiting for {what} "
                                     f"(last: {last!r})")
        time.sleep(every_s if waited < _FAST_POLL_FOR_S else max(every_s, _SLOW_POLL_S))


def _environ_values(name: str):
    """``(pid, value)`` of ``name`` in the environment of each process but this one that has
    it, read straight from ``/proc/PID/environ``: every test's teardown sweeps the machine's
    few hundred processes, and psutil's objects cost about five times the reads (a process
    that ends meanwhile, or is another user's, is passed over)."""
    from berth.process import _proc_file
    key, me = b"\0" + name.encode() + b"=", os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        env = _proc_file(int(entry.name), "environ", 1 << 20)
        if env is None:
            continue
        env = b"\0" + env
        at = env.find(key)
        if at >= 0:
            end = env.find(b"\0", at + len(key))
            yield int(entry.name), env[at + len(key):end if end >= 0 else None].decode(
                errors="replace")


def _processes(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:            # ended since it was read
            pass
    return found


def ours(tmp: Path) -> list[psutil.Process]:
    """Every process started for this test: its environment names a state dir at or under
    ``tmp`` (``berth demo`` and the bench make theirs under ``$TMPDIR``, which tests set to
    ``tmp``). The test process itself is not one of them."""
    root = str(tmp)
    return _processes([pid for pid, state in _environ_values("BERTH_STATE_DIR")
                       if state == root or state.startswith(root + os.sep)])


def _kill_and_wait(procs: list[psutil.Process], timeout_s: float = 5.0) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)


def sweep(tmp: Path) -> None:
    """SIGKILL every process :func:`ours` finds under ``tmp`` and wait for them (5 s at most)."""
    _kill_and_wait(ours(tmp))


def stop_group(p: subprocess.Popen, timeout_s: float = 10.0) -> int | None:
    """Stop a process the test started, whatever it was doing: SIGKILL its process group (it
    leads one when started with ``start_new_session=True``; otherwise it alone is killed) and
    reap it. Returns its exit code, or None if it did not exit within ``timeout_s`` seconds.

    A process already reaped is left alone: its group id may belong to another group by now
    (what its group left behind is :func:`sweep`'s)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:          # not a group leader: it alone
            try:
                p.kill()
            except ProcessLookupError:
                pass
        except PermissionError:             # a group leader run as another user: not ours
            pass
    try:
        return p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def stop_all(procs, tmp: Path | None = None) -> None:
    """:func:`stop_group` each of ``procs`` (``subprocess.Popen``), then :func:`sweep` ``tmp``:
    the one way a fixture stops what its test started."""
    for p in procs:
        if p is not None:
            stop_group(p)
    if tmp is not None:
        sweep(tmp)


def run_marks() -> dict[str, str]:
    """The environment entry that marks a process as this pytest run's (for a process started
    with an environment of its own rather than a copy of ``os.environ``)."""
    return {RUN_ENV: os.environ[RUN_ENV]} if RUN_ENV in os.environ else {}


def sweep_run(token: str) -> int:
    """SIGKILL every process started by this pytest run: its environment carries
    ``BERTH_TEST_RUN`` equal to ``token`` or under it (``token/…``: an xdist worker's mark, so
    the controller's token covers its workers and all they started). The calling process is
    spared. Returns how many were found."""
    found = _processes([pid for pid, mark in _environ_values(RUN_ENV)
                        if mark == token or mark.startswith(token + "/")])
    _kill_and_wait(found)
    return len(found)


_PORTS = random.SystemRandom()      # not the random module's state, which a plugin may reseed


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, chosen below the kernel's ephemeral range: a port the
    kernel hands out for ``bind(0)`` is also handed to the next outgoing connection of any
    process, so a server started on it seconds later could find it taken (seen under xdist:
    "address already in use"). Random in this xdist worker's stripe (:func:`_stripe`) of
    :data:`berth.sim.ports.LOW` (20000: the docs' fixed ports lie below it, and their tests run
    beside these) up to that range, checked by binding it, and never one this process was
    given already (two calls in a row returned the same port about once in 12,000, and two
    workers could draw the same port at once)."""
    lo, hi = _stripe()
    if len(_GIVEN) * 2 > hi - lo:
        _GIVEN.clear()              # most of the stripe given: the oldest are long closed
    for _ in range(200):
        port = _PORTS.randrange(lo, hi)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_GIVEN: set[int] = set()


def _stripe() -> tuple[int, int]:
    """This process's ports, ``[lo, hi)``: the band from :data:`berth.sim.ports.LOW` to the
    ephemeral range cut in one stripe per xdist worker (the whole band outside xdist)."""
    from berth.sim.ports import LOW
    hi = max(LOW + 1, min(_ephemeral_start(), 32768))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else -1
    if not 0 <= index < count:
        return LOW, hi
    width = (hi - LOW) // count
    return LOW + index * width, LOW + (index + 1) * width


def sigint_as_a_terminal() -> None:
    """``preexec_fn`` for a child that a test stops with Ctrl-C's SIGINT: the default
    disposition, as a terminal's foreground command has. A suite started in the background
    of a non-interactive shell inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt (the Ctrl-C tests timed out in such a run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def log_at_the_fd_limit(script: str, tmp_path: Path) -> str:
    """Run ``script`` (a server that prints its port, then serves with a descriptor limit of
    48 and a connection bound past it), hold 120 connections to it for 3.5 s, and return its
    stderr: what a few seconds at the limit log (asyncio retries a failed accept each second).
    The 3.5 s is the measure, not a synchronisation."""
    import asyncio
    import sys
    err = open(tmp_path / "err.log", "w+")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=err,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port = int(proc.stdout.readline())

        async def flood():
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(120)]
            end = time.monotonic() + 3.5
            while time.monotonic() < end:
                await asyncio.sleep(0.1)
            for _, w in conns:
                w.close()
        asyncio.run(asyncio.wait_for(flood(), 30))
    finally:
        proc.kill()
        proc.wait(5)
    err.seek(0)
    return err.read()
