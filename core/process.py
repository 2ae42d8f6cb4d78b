"""Process identity: a PID plus its start time, and signals only to what Berth started.

Source: seed 002 rule 6 ("never signal what Berth did not start"); issue 4 "Signals". A PID
alone is not an identity: PIDs are reused. Berth records ``(pid, start_time)`` when it starts a
process and checks both before every signal; a PID that now belongs to another process (its start
time differs) is never signalled.
"""

from __future__ import annotations

import os
import select
import signal as _signal
from dataclasses import dataclass

import psutil

__all__ = ["ProcessId", "identify", "alive", "program_and_user", "signal_process", "signal_group", "tree_pids",
           "peer_credentials", "SignalRefused", "Liveness", "Ancestry"]

#: Start times from psutil are floats; two reads of one process agree to well under this.
_TOLERANCE_S = 0.05


class SignalRefused(RuntimeError):
    """Berth refused to signal: the PID is gone, or now belongs to another process."""


@dataclass(frozen=True)
class ProcessId:
    """A process identity: ``pid`` and ``start_time`` (seconds since the epoch, psutil's
    ``create_time()``)."""

    pid: int
    start_time: float


def identify(pid: int) -> ProcessId | None:
    """The identity of the process ``pid`` now (a zombie included: it still holds its PID and
    start time), or ``None`` if there is none."""
    try:
        return ProcessId(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return None


def program_and_user(pid: int, width: int = 60) -> tuple[str, str] | None:
    """``("python3 train.py --big", "ana")``: the process's command line (its program's base
    name first, cut to ``width`` characters; its name when the command line is hidden) and
    its user (the uid as digits when it has no name), or ``None`` when ``pid`` is gone or
    cannot be read. Source: issue 37 (a stowaway named whole)."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            argv, name = p.cmdline(), p.name()
            try:
                user = p.username()
            except KeyError:
                user = str(p.uids().real)
    except (psutil.Error, OSError):
        return None
    words = " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else name
    if len(words) > width:
        words = words[:width - 1] + "…"
    return words, user


def alive(pid_id: ProcessId) -> bool:
    """True if ``pid_id.pid`` is alive, not a zombie, and started at ``pid_id.start_time``."""
    try:
        p = psutil.Process(pid_id.pid)
        if abs(p.create_time() - pid_id.start_time) > _TOLERANCE_S:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


class Liveness:
    """:func:`alive` for the processes berthd's reader asks about at every read (each lease's
    holder and owner), at the cost of a ``poll`` once a process was found alive: a pidfd on it
    becomes readable when it exits, and a pidfd names one process, never a later one that
    reuses its PID. The first ask of an identity, and every ask where pidfds are missing
    (Linux before 5.3, a seccomp filter), is :func:`alive` itself. :meth:`sweep` closes what
    was not asked since the sweep before. Where the two part: a process whose main thread
    ended while other threads run reads as a zombie to :func:`alive` (dead), and lives for
    the pidfd until its last thread ends."""

    def __init__(self) -> None:
        self._fds: dict[ProcessId, int] = {}
        self._dead: set[ProcessId] = set()
        self._asked: set[ProcessId] = set()

    def alive(self, pid_id: ProcessId) -> bool:
        self._asked.add(pid_id)
        if pid_id in self._dead:
            return False
        fd = self._fds.get(pid_id)
        if fd is not None:
            poll = select.poll()            # not select(): a descriptor may be over 1023
            poll.register(fd, select.POLLIN)
            if not poll.poll(0):
                return True
            # Exited (a zombie included): an identity never lives again.
            os.close(self._fds.pop(pid_id))
            self._dead.add(pid_id)
            return False
        fd = _pidfd(pid_id.pid)     # before the check: the check then vouches for its process
        ok = alive(pid_id)
        if ok and fd is not None:
            self._fds[pid_id] = fd
        elif fd is not None:
            os.close(fd)
        return ok

    def sweep(self) -> None:
        """Forget every identity not asked about since the last sweep (a lease that ended)."""
        for pid_id in [p for p in self._fds if p not in self._asked]:
            os.close(self._fds.pop(pid_id))
        self._dead &= self._asked
        self._asked = set()

    def close(self) -> None:
        self._asked = set()
        self.sweep()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class Ancestry:
    """Which of some processes are a root or descend from it, as :func:`tree_pids` would
    find them, for one pass of berthd's reader: asked only about the few processes that
    matter (those on the cards), it walks *up* from each through the parent named in
    ``/proc/PID/stat``, one read a process per pass however many roots are asked about, where
    :func:`tree_pids` reads a file for every thread of every process of each root's tree (an
    engine runs dozens of threads). Make a new one for each pass: it remembers the parents
    it read."""

    def __init__(self) -> None:
        self._up: dict[int, tuple[int, ...]] = {}

    def within(self, pids, root: int) -> set[int]:
        """Those of ``pids`` that are ``root`` or below it now."""
        return {p for p in pids if root in self._chain(p)}

    def _chain(self, pid: int) -> tuple[int, ...]:
        """``pid`` and its ancestors, nearest first; empty when ``pid`` is gone."""
        path: list[int] = []
        cur = pid
        while cur > 0 and cur not in self._up:
            parent = _parent(cur)
            if parent is None or cur in path:   # gone; or a PID reused mid-walk made a loop
                self._up[cur] = ()
                break
            path.append(cur)
            cur = parent
        tail = self._up.get(cur, ())
        for i in range(len(path) - 1, -1, -1):
            tail = self._up[path[i]] = (path[i], *tail)
        return self._up.get(pid, ())


def _proc_file(pid: int, name: str, size: int = 4096) -> bytes | None:
    """``/proc/PID/NAME`` (its first ``size`` bytes), or ``None`` when ``pid`` is gone or not
    readable. Not open(): a file object costs four more system calls (fstat, ioctl, lseek, a
    second read), and berthd's reader asks this of each process on the cards at every read."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def process_name(pid: int) -> str | None:
    """The process's name (``/proc/PID/comm``: its program's base name, 15 characters at most;
    an exec changes it), or ``None`` when ``pid`` is gone."""
    data = _proc_file(pid, "comm")
    return None if data is None else data.decode(errors="replace").rstrip("\n")


def _parent(pid: int) -> int | None:
    """The parent's PID from ``/proc/PID/stat`` (0 above the topmost), or ``None`` when
    ``pid`` is gone."""
    data = _proc_file(pid, "stat")
    if data is None:
        return None
    try:
        return int(data[data.rfind(b")") + 2:].split(None, 2)[1])
    except (IndexError, ValueError):
        return None


def signal_process(pid_id: ProcessId, sig: int = _signal.SIGTERM) -> None:
    """Send ``sig`` to the process, only if it is still the one recorded.
    Raises :class:`SignalRefused` otherwise."""
    if not alive(pid_id):
        raise SignalRefused(f"pid {pid_id.pid}: not the process Berth started "
                            f"(start time {pid_id.start_time}); not signalled")
    os.kill(pid_id.pid, sig)


def signal_group(leader: ProcessId, sig: int = _signal.SIGTERM) -> None:
    """Send ``sig`` to the process group led by ``leader`` (pgid = its pid), only if the leader
    is still the process Berth started, or is gone while members of its group remain (the group
    id cannot be reused while any member lives). Raises :class:`SignalRefused` otherwise."""
    if alive(leader):
        os.killpg(leader.pid, sig)
        return
    now = identify(leader.pid)
    if now is not None and abs(now.start_time - leader.start_time) > _TOLERANCE_S:
        raise SignalRefused(f"pid {leader.pid} now belongs to another process; group not signalled")
    # The leader is gone, or is the zombie of the very process Berth started (same start time;
    # not yet reaped, as when its parent was SIGKILLed): the group id is still Berth's.
    members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == leader.pid]
    if not members:
        raise SignalRefused(f"process group {leader.pid} is empty")
    os.killpg(leader.pid, sig)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def tree_pids(root: int) -> set[int]:
    """``root`` and all its descendants that are alive now (empty if ``root`` is gone).

    Walked down from ``root`` through each thread's ``/proc/PID/task/TID/children``, which costs
    the tree's size; psutil's walk reads the parent of every process on the machine, and berthd
    walks each lease's tree at every read (issue 38: that was the larger part of berthd's CPU, a
    few milliseconds a lease a read with a few hundred processes). Where the kernel has no
    ``children`` files (``CONFIG_PROC_CHILDREN`` off), psutil's walk."""
    try:
        p = psutil.Process(root)
        if _CHILDREN_FILES:
            return _descendants(root)
        return {root} | {c.pid for c in p.children(recursive=True)}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return set()


_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it, from the ``children`` files of each one's threads
    (a thread or process that exits meanwhile is skipped: the walk is a snapshot)."""
    found, todo = {root}, [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = f.read().split()
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def peer_credentials(sock) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket (``SO_PEERCRED``),
    or ``None`` for other sockets."""
    import socket
    import struct
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", raw)
