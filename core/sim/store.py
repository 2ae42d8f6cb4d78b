"""The simulated cards' state file, shared by every process: a locked transaction over it.

Source: issue 3 "simulated cards". ``cards.json`` is the whole state, ``cards.lock`` the
``fcntl.flock`` lock every writer takes; writes are atomic (:func:`berth.paths.write_atomic`).
Each transaction first runs the GC step of :mod:`berth.sim.cards` (its docstring: "Exit and the
free delay"): a process gone for ``free_delay_s`` since a reader first saw it gone has its memory
freed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from berth.paths import UnsafePath, open_shared, write_atomic

__all__ = ["STATE_FILE", "LOCK_FILE", "SimError", "Txn", "load", "transaction", "start_time"]

STATE_FILE = "cards.json"
LOCK_FILE = "cards.lock"
_VERSION = 1
_NOT_DECLARED = ("no simulated cards in {dir}: run `berth sim init --card gpu0=24GiB`, or declare "
                 "[[driver.cards]] under [driver] kind = \"sim\" in berth.toml")


class SimError(RuntimeError):
    """The store refused: not initialised, unknown card, unknown process, corrupt state file, or a
    state-machine edge that does not exist. ``cuda_error`` is the CUDA error number a stand-in
    ``cuda-checkpoint`` exits with (reference "Exit codes"), or 1 (invalid value) by default."""

    def __init__(self, message: str, cuda_error: int = 1):
        super().__init__(message)
        self.cuda_error = cuda_error


class Txn:
    """One locked pass over the state: ``data`` (``None`` before the first declaration) and
    whether it changed (``dirty``: written back at the end)."""

    __slots__ = ("data", "dirty")

    def __init__(self) -> None:
        self.data: dict | None = None
        self.dirty = False


def start_time(pid: int, boot: float | None = None) -> float | None:
    """The process's start time (``psutil``'s create time, seconds since the epoch), or ``None``
    when it is gone or a zombie (a zombie has released its memory already).

    Read from ``/proc/PID/stat`` with psutil's own arithmetic (start ticks / clock ticks + boot
    time), so the value is psutil's to the bit: the stand-in cuda-checkpoint runs once per park
    and wake step and psutil's import was a third of its start (issue 38). psutil answers where
    ``/proc`` does not read. ``boot``: the boot time (:func:`boot_time`) where the caller
    read it already, for many processes at once."""
    try:
        data = _read(f"/proc/{int(pid)}/stat")
        if boot is None:
            boot = boot_time()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, StopIteration, ValueError):
        return _psutil_start_time(pid)
    fields = data[data.rfind(b")") + 2:].split()   # the name, in parentheses, may hold anything
    if fields[0] == b"Z":
        return None
    return float(fields[19]) / _CLOCK_TICKS + boot


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def boot_time() -> float:
    """The boot time (seconds since the epoch) as ``/proc/stat`` says it now, psutil's base
    for start times. Raises ``OSError``, ``ValueError``."""
    data = _read("/proc/stat")
    at = data.index(b"\nbtime ") + 7
    return float(data[at:data.index(b"\n", at)])


def _read(path: str) -> bytes:
    """The whole of a small file under /proc. Not open(): a file object costs four more
    system calls (fstat, ioctl, lseek, a read more), and every pass over the store reads one
    such file for each process in it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _psutil_start_time(pid: int) -> float | None:
    import psutil
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, ValueError):
        return None
    except psutil.AccessDenied:   # another user's process: it exists, its status is private
        try:
            return psutil.Process(pid).create_time()
        except psutil.Error:
            return None


def _gc(st: "Txn") -> None:
    """Free the memory of processes gone for ``free_delay_s`` since a reader first saw it."""
    now = time.monotonic()
    delay = st.data["free_delay_s"]
    # One read of the boot time for the pass, not one a process: each pass (every driver
    # read) checks every process in the store.
    try:
        boot: float | None = boot_time()
    except (OSError, ValueError):
        boot = None
    for key, p in list(st.data["procs"].items()):
        seen = p["gone_seen_at"]
        if seen is None:
            start = start_time(p["pid"], boot)
            if start is not None and abs(start - p["start_time"]) < 0.01:
                continue
            p["gone_seen_at"] = seen = now
            st.dirty = True
        elif seen > now:   # a stale state file from before a reboot
            p["gone_seen_at"] = seen = now
            st.dirty = True
        if now - seen >= delay:
            del st.data["procs"][key]
            st.dirty = True


def load(directory: Path) -> dict:
    path = directory / STATE_FILE
    try:
        # As the lock: no symlink followed, no wait on a FIFO planted there (issue 36).
        fd = open_shared(path, os.O_RDONLY, create_mode=None)
    except FileNotFoundError:
        raise SimError(_NOT_DECLARED.format(dir=directory)) from None
    except UnsafePath as e:
        raise SimError(str(e)) from None
    try:
        text = _read_fd(fd).decode("utf-8")
    finally:
        os.close(fd)
    try:
        data = json.loads(text)
        if data.get("version") != _VERSION:
            raise ValueError(f"version {data.get('version')!r}")
        if not isinstance(data.get("cards"), list) or not isinstance(data.get("procs"), dict):
            raise ValueError("no cards list or procs table")
    except (ValueError, KeyError, AttributeError) as e:
        raise SimError(f"{path}: the simulated card state is corrupt ({e}); remove the file "
                       "and declare the cards again") from None
    return data


@contextlib.contextmanager
def transaction(directory: Path, create: bool = False) -> Iterator["Txn"]:
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = _open_lock(directory)
    except FileNotFoundError:
        raise SimError(_NOT_DECLARED.format(dir=directory)) from None
    except UnsafePath as e:
        raise SimError(str(e)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = Txn()
        if create and not (directory / STATE_FILE).exists():
            st.data = None
        else:
            st.data = load(directory)
            _gc(st)
        try:
            yield st
        finally:
            if st.dirty and st.data is not None:
                _write(directory, st.data)
    finally:
        os.close(fd)


def _open_lock(directory: Path) -> int:
    """The lock file's descriptor (made 0644 if missing), opened as every file in a directory
    other processes write (:func:`berth.paths.open_shared`: no symlink followed, no wait on a
    FIFO, nothing writable by others). Read-only, which ``flock`` needs no more than, and of any
    owner: the simulated cards are one machine's, shared by every user's engines (a second
    user's engine on root's simulated card, tests/security). Raises ``FileNotFoundError`` (no
    such directory), :class:`~berth.paths.UnsafePath`."""
    return open_shared(directory / LOCK_FILE, os.O_RDONLY, create_mode=0o644)


def _write(directory: Path, data: dict) -> None:
    # 0644: every user's engines read the simulated cards (a driver's state is no secret).
    write_atomic(directory / STATE_FILE, json.dumps(data, indent=1, sort_keys=True).encode(),
                 mode=0o644)
