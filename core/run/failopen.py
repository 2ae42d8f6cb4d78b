"""``berth run`` while berthd cannot be reached: start the engine unleased only where it fits.

Source: issue 26 "Fail open only when it is safe"; README "When berthd is down: fail-open". With
berthd down nothing is admitted, so an engine started then takes whatever memory it finds: in
the soak, engines started so ran into memory other engines held (``oom_events`` 2 in two runs).

:func:`measure` decides, from what berthd would read:

1. berth.toml as berthd reads it (its driver, each card's reserve, the engine's entry), found as
   every client finds it (``$BERTH_CONFIG`` or the usual place);
2. the sizes the run asks (``--size``, else the entry's ``size`` and ``card``);
3. the driver itself, read now: each share fits when its bytes are at most the card's free bytes
   less its reserve (a share with no card goes where the room is largest; a whole card,
   ``card``, only on a card with no process on it).

It fits: the run starts the engine unleased on those cards (``CUDA_VISIBLE_DEVICES`` names them)
and registers with berthd once berthd is back, adopting the engine (its memory counts as its own,
as a stowaway's would). It does not fit, or any of this cannot be read: the run waits for berthd,
saying why, up to ``--start-limit``, and measures again meanwhile.

One run at a time decides: two runs measuring at the same moment both read the same free
bytes, both found that they fit and both started, and the second engine's allocation failed on
the card (an OOM) although each alone fitted. So every ``berth run`` on the machine takes an
exclusive :func:`fcntl.flock` on one lock file (:class:`StartLock`) before it measures, without
waiting: a run that finds it held says who holds it, keeps asking berthd and
tries again a second later (up to ``--start-limit`` in all). A run that does not fit lets the
lock go at once; one that fits keeps it until its engine's memory shows to the driver
(:meth:`FailOpen.hold`): the engine's process tree uses at least the bytes it asked on each
card, or its health check answers, or it exits, or ``--start-limit`` passes; the next run then
measures with that memory counted. The lock is never taken while berthd answers (a run asks
berthd first, every time) and is let go once berthd leases the engine. A run that dies lets it
go with it: the kernel drops a flock with its file's last descriptor, which the engine does not
inherit (``O_CLOEXEC``).

Where the lock file is (:func:`lock_path`): every run of every user sharing the cards must name
the same file, whatever its own config and rights say.

- Simulated cards: ``<sim dir>/failopen.lock``. The simulated cards are that directory, which
  every process using them names and writes; two sets of simulated cards (tests side by side)
  do not hold each other up.
- Real cards: ``/dev/shm/berth-failopen.lock`` (``/tmp/berth-failopen.lock`` on a system with no
  ``/dev/shm``): a fixed path, as the cards are the machine's. Not berth's state directory nor
  the socket's: both are resolved per user (``$XDG_RUNTIME_DIR``, each user's own berth.toml),
  and ``/run/berth`` is not writable by users, so two users sharing the cards could lock two
  different files, or one of them none. ``/dev/shm`` rather than ``/tmp``: a service under
  systemd's ``PrivateTmp`` (llama-swap as a unit) has a ``/tmp`` of its own but the machine's
  ``/dev/shm``. A container shares it only with ``--ipc=host``.

The file is made mode 0644 and opened read-only (a flock needs no write access), without
following a symlink and without blocking (:func:`berth.paths.open_shared`), then checked: a
FIFO, a symlink, a directory or a file others can write at its path is refused, in the log with
the path and its owner, and the run measures without the lock (a FIFO planted there made every
run block in ``open`` forever, deaf to SIGTERM: issue 36). One that cannot be opened for another
reason makes the run wait for berthd, as a card that cannot be read does. Any local user can hold the lock: that delays other runs' fail-open (up
to their ``--start-limit``); it never starts an engine.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from berth import paths
from berth.decide.units import format_size as fmt_bytes
from berth.decide.units import parse_size
from berth.driver.base import Driver, DriverError
from berth.process import tree_pids
from berth.run import starting
from berth.run.starting import Starting

if TYPE_CHECKING:                                   # the run spawns it
    from berth.run.engine import EngineProcess

__all__ = ["Room", "measure", "FailOpen", "StartLock", "lock_path"]

log = logging.getLogger("berth.run")

#: Seconds between two driver reads while a run holds the lock for its starting engine.
_SHOWS_EVERY_S = 0.25


@dataclass(frozen=True)
class Room:
    """:func:`measure`'s verdict. ``fits``: the engine may start unleased; ``why``: one line
    for the log either way; ``cards``: where it runs (``{"pci", "name", "uuid", "bytes"}``, as a
    grant gives them); ``driver``: ``{"kind", "sim_dir"}``, as a grant gives it; ``shares``:
    bytes asked per card PCI (a whole card's are not); ``busy``: another run holds the
    fail-open lock (this one tries again a second later)."""

    fits: bool
    why: str
    cards: list[dict] = field(default_factory=list)
    driver: dict = field(default_factory=dict)
    shares: dict[str, int] = field(default_factory=dict)
    busy: bool = False


def lock_path(cfg) -> Path:
    """The fail-open lock file for the cards of ``cfg`` (a loaded berth.toml): see the module
    docstring for the choice."""
    if cfg.driver.kind == "sim":
        return paths.sim_dir(cfg) / "failopen.lock"
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path("/tmp")) / "berth-failopen.lock"


def _open_lock(path: Path) -> int:
    """A read-only descriptor on the lock file, made (mode 0644) if missing, by
    :func:`berth.paths.open_shared`: never following a symlink, never blocking on a FIFO, and
    refusing anything but a regular file that others cannot write. In a directory every user
    writes (``/dev/shm``) any user may have made it; elsewhere (the simulated cards' directory)
    it is this user's, root's or the directory's owner's. Raises :class:`~berth.paths.UnsafePath`
    (what is there and its owner) or ``OSError``."""
    parent = os.stat(path.parent)
    owners = None if parent.st_mode & 0o002 else (os.geteuid(), 0, parent.st_uid)
    return paths.open_shared(path, os.O_RDONLY, create_mode=0o644, owners=owners)


def _who(pid: int) -> str:
    """A process in words: ``berth run --engine A (pid 123, user ann)``."""
    try:
        argv = [a.decode(errors="replace")
                for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return f"pid {pid}"
    try:
        import pwd
        user = pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        user = str(uid)
    what = os.path.basename(argv[0]) if argv else "a process"
    for i, a in enumerate(argv):
        if a == "--engine" and i + 1 < len(argv):
            what = f"berth run --engine {argv[i + 1]}"
        elif a.startswith("--engine="):
            what = f"berth run --engine {a.split('=', 1)[1]}"
    return f"{what} (pid {pid}, user {user})"


def _holder(fd: int) -> str:
    """Who holds the flock on ``fd``'s file, as ``/proc/locks`` tells (by device and inode);
    ``another process`` where it does not."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        f = line.split()
        if len(f) > 5 and f[1] == "FLOCK" and f[5] == key and f[4].isdigit():
            return _who(int(f[4]))
    return "another process"


class StartLock:
    """The exclusive flock on ``path`` that serialises the fail-open decision (see the module
    docstring). :meth:`take` never waits; :meth:`release` may be called any number of times."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def take(self) -> str | None:
        """``None``: this run holds the lock now. Else who holds it, in words. Raises
        ``OSError`` when the file cannot be opened or locked."""
        fd = _open_lock(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            os.close(fd)
            return who
        except OSError:
            os.close(fd)
            raise
        self.fd = fd
        return None

    def release(self) -> None:
        """Let the lock go (closing the only descriptor drops the flock)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def _uses(driver: Driver, shares: dict[str, int], root: int) -> bool:
    """Whether the process tree of ``root`` uses at least ``shares`` (bytes per card PCI) on
    every card, as ``driver`` reads now. Blocking. A read that fails counts as not yet."""
    if not shares:
        return False
    pids = tree_pids(root)
    try:
        return all((driver.read(pci).use_of(pids) or 0) >= n for pci, n in shares.items())
    except DriverError:
        return False


def _open(cfg) -> Driver:
    """The driver berthd would use, without declaring anything (berthd declares simulated
    cards; a run only reads them). Raises :class:`DriverError`."""
    if cfg.driver.kind == "sim":
        from berth.sim.driver import SimDriver
        return SimDriver(paths.sim_dir(cfg))
    from berth.driver.nvml import NvmlDriver
    return NvmlDriver(proc_root=cfg.driver.proc_root)


def _names(cfg, infos) -> dict[str, str]:
    """PCI -> the card's short name, as berthd names it (declared name, else ``gpuN``)."""
    declared = {c.pci: c.name for c in cfg.driver.cards}
    return {c.pci: declared.get(c.pci, f"gpu{i}") for i, c in enumerate(infos)}


def _asks(o, cfg) -> list[tuple[str | None, int | None]]:
    """``(card key or None, bytes or None for a whole card)`` per share the run asks. Raises
    ``ValueError`` when neither the run line nor berth.toml gives a size."""
    if o.sizes:
        return [(card, parse_size(size, field="--size", allow_card=True))
                for card, size in o.sizes]
    entry = cfg.engines.get(o.engine)
    if entry is None:
        raise ValueError(f"engine {o.engine!r} has no --size and no [engines.{o.engine}] entry")
    return [(entry.card, entry.size)]


def _place(ask, infos, names, reads, reserves, taken) -> tuple[str | None, str]:
    """The card for one share ``(key, bytes)``, or ``None`` and why not."""
    key, size = ask
    cands = [c.pci for c in infos if key is None or key in (c.pci, names[c.pci])]
    if not cands:
        return None, f"no card {key!r}"
    room = {p: reads[p].free_bytes - reserves[p] - taken.get(p, 0) for p in cands}
    if size is None:
        empty = [p for p in cands if reads[p].processes_known and not reads[p].processes]
        if not empty:
            return None, "a whole card is asked and every card has a process on it"
        return max(empty, key=room.get), ""
    best = max(cands, key=room.get)
    if size > room[best]:
        return None, (f"{fmt_bytes(size)} does not fit beside what {names[best]} holds "
                      f"({fmt_bytes(max(0, room[best]))} free after its "
                      f"{fmt_bytes(reserves[best])} reserve)")
    return best, ""


def measure(o, cfg=None) -> Room:
    """Whether the run ``o`` (:class:`~berth.run.cli.RunOptions`) may start its engine unleased
    now (see the module docstring). ``cfg``: berth.toml loaded (else it is loaded here).
    Blocking (reads berth.toml and the driver): call it in a thread. Never raises."""
    from berth.config import ConfigError, load_config
    try:
        cfg = cfg or load_config(None)[0]
        asks = _asks(o, cfg)
        driver = _open(cfg)
    except (ConfigError, ValueError, DriverError, OSError) as e:
        return Room(False, f"cannot tell whether it fits: {e}")
    try:
        infos = driver.cards()
        names = _names(cfg, infos)
        reads = {c.pci: driver.read(c.pci) for c in infos}
    except DriverError as e:
        return Room(False, f"cannot read the cards: {e}")
    finally:
        driver.close()
    reserves = {c.pci: cfg.card_config(c.pci, names[c.pci]).reserve for c in infos}
    taken: dict[str, int] = {}
    shares: dict[str, int] = {}
    cards = []
    for ask in asks:
        pci, why = _place(ask, infos, names, reads, reserves, taken)
        if pci is None:
            return Room(False, why)
        size = ask[1] if ask[1] is not None else reads[pci].free_bytes - reserves[pci]
        taken[pci] = taken.get(pci, 0) + size
        if ask[1] is not None:
            shares[pci] = shares.get(pci, 0) + size
        uuid = next(c.uuid for c in infos if c.pci == pci)
        cards.append({"pci": pci, "name": names[pci], "uuid": uuid, "bytes": size})
    said = ", ".join(f"{fmt_bytes(c['bytes'])} on {c['name']}" for c in cards)
    kind = {"kind": driver.kind,
            "sim_dir": str(paths.sim_dir(cfg)) if cfg.driver.kind == "sim" else None}
    return Room(True, f"it fits beside what the cards hold ({said}, reserve kept)", cards, kind,
                shares)


class FailOpen:
    """The run's side of berthd being unreachable at start (see the module docstring):
    :meth:`step` after each failed attempt to reach berthd. ``every_s``: seconds between two
    measures; ``o.start_limit_s``: how long the run waits for berthd when it does not fit;
    ``remind_s``: seconds between two reminders of the wait (what it waits for, how long is
    left, what the user can do), the first said at once; ``clock``: monotonic seconds.
    ``lock``: the fail-open lock, held from a measure that fits until the engine's memory
    shows (:meth:`hold`, :meth:`answered`, :meth:`let_go`)."""

    def __init__(self, o, every_s: float = 5.0, remind_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic, socket: Path | None = None):
        self.o = o
        #: berthd's socket as the run names it: a berthd process of it that is starting is
        #: waited for before any measure (:mod:`berth.run.starting`); ``None``: not looked for.
        self.socket = socket
        self._starting: Starting | None = None
        self.every_s = every_s
        self.remind_s = remind_s
        self.clock = clock
        self.since: float | None = None
        self.lock: StartLock | None = None
        self._cfg = None
        self._shares: dict[str, int] = {}
        self._gone: asyncio.Event | None = None
        self._measured_at: float | None = None
        self._said: str | None = None
        self._told_at: float | None = None

    async def step(self, error: Exception) -> Room | None | bool:
        """A :class:`Room` that fits: start unleased there. ``False``: keep waiting for
        berthd (always with ``--require-berthd``). ``None``: ``--start-limit`` has passed
        (said in the log): do not start."""
        now = self.clock()
        if self.since is None:
            self.since = now
        if self.o.require_berthd:
            self._require(error, now)
            return False
        due = self._measured_at is None or now - self._measured_at >= self.every_s
        if due and await self._berthd_starting(now):
            due = False
        if due:
            self._measured_at = now
            room = await asyncio.to_thread(self._turn)
            if room.busy:
                self._measured_at = None        # the lock again at the next step, in 1 s
            if room.fits:
                log.warning("%s; running %s UNLEASED (fail-open): %s. It registers with berthd "
                            "once berthd is back (--require-berthd waits instead)", error,
                            self.o.engine, room.why)
                return room
            if room.why != self._said:
                self._said, self._told_at = room.why, now
                log.warning("%s; not starting %s unleased: %s. Waiting for berthd: %s (it "
                            "starts as soon as berthd answers)%s", str(error).rstrip("."),
                            self.o.engine, room.why.rstrip("."), self._left(now), self._less())
        if now - self.since >= self.o.start_limit_s:
            log.error("berthd did not come back within --start-limit %.0fs and %s cannot start "
                      "unleased (%s): not starting it", self.o.start_limit_s, self.o.engine,
                      self._said)
            return None
        if self._told_at is not None and now - self._told_at >= self.remind_s:
            self._told_at = now
            if self._starting is not None:
                log.warning("still waiting for berthd (pid %d) to answer at %s (%s%s)",
                            self._starting.pid, self.socket, self._left(now), self._less())
                return False
            log.warning("still waiting for berthd (%s%s): %s; %s does not start unleased: %s",
                        self._left(now), self._less(), str(error).rstrip("."), self.o.engine,
                        (self._said or "").split(". ")[0])
        return False

    async def _berthd_starting(self, now: float) -> bool:
        """Whether a berthd process of this run's socket is starting (younger than
        :data:`~berth.run.starting.STARTING_S`): then the run waits for it, said once per
        berthd, and measures nothing (issue 37: under supervisord a run failed open while
        berthd started beside it, and berthd then granted others over its engine). A berthd
        that was waited for and is no longer starting is said too."""
        if self.socket is None:
            return False
        up = await asyncio.to_thread(starting.find, self.socket)
        if up is not None and up.age_s < starting.STARTING_S:
            if self._starting is None or self._starting.pid != up.pid:
                self._told_at = now
                log.warning("berthd is not answering yet at %s: berthd (pid %d) started %.0fs "
                            "ago and is still starting; %s waits for it before deciding whether "
                            "to start unleased (until it answers, exits or is %.0fs old; %s)",
                            self.socket, up.pid, up.age_s, self.o.engine, starting.STARTING_S,
                            self._left(now))
            self._starting = up
            return True
        if self._starting is not None:
            was, self._starting = self._starting, None
            how = ("exited without answering" if up is None or up.pid != was.pid else
                   f"did not answer within {starting.STARTING_S:.0f}s of its start")
            log.warning("berthd (pid %d) %s: %s decides whether to start unleased as with "
                        "berthd down", was.pid, how, self.o.engine)
        return False

    def _turn(self) -> Room:
        """Take the fail-open lock without waiting, then :func:`measure`; the lock is kept only
        when it fits. Blocking: runs in a thread. Never raises."""
        from berth.config import ConfigError, load_config
        try:
            cfg, _ = load_config(None)
        except (ConfigError, OSError) as e:
            return Room(False, f"cannot tell whether it fits: {e}")
        lock = StartLock(lock_path(cfg))
        try:
            holder = lock.take()
        except paths.UnsafePath as e:
            # Refused, it must not hold every run up (a planted FIFO did, forever): measure
            # without the lock, as a run did before the lock existed (issue 36).
            log.warning("the fail-open lock is refused: %s. %s measures the cards without it "
                        "(another run starting unleased now is not serialised with this one)",
                        e, self.o.engine)
            return measure(self.o, cfg)
        except OSError as e:
            return Room(False, f"cannot take the fail-open lock {lock.path}: "
                               f"{e.strerror or e}")
        if holder is not None:
            return Room(False, f"{holder} holds the fail-open lock {lock.path} while its "
                               f"engine starts unleased; {self.o.engine} measures the cards "
                               f"once that engine's memory shows", busy=True)
        room = measure(self.o, cfg)
        if room.fits:
            self.lock, self._cfg, self._shares = lock, cfg, room.shares
        else:
            lock.release()
        return room

    async def hold(self, engine: EngineProcess) -> None:
        """Keep the fail-open lock while the started ``engine`` loads, until its process tree
        uses at least the bytes asked on each card (as the driver reads, every 0.25 s), it
        exits, or ``--start-limit`` passes; :meth:`answered` may let it go first. Cancelled
        (the run stops), it lets the lock go too."""
        if self.lock is None:
            return
        why = "the run stops"
        self._gone = gone = asyncio.Event()     # let go meanwhile (:meth:`answered`)
        tasks = {asyncio.create_task(self._shows(engine)): "its memory shows on the card",
                 asyncio.create_task(engine.proc.wait()): "it exited",
                 asyncio.create_task(gone.wait()): ""}
        try:
            done, _ = await asyncio.wait(tasks, timeout=self.o.start_limit_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            why = (tasks[done.pop()] if done else
                   f"its memory did not show within --start-limit {self.o.start_limit_s:.0f}s")
        finally:
            for t in tasks:
                t.cancel()
            self.let_go(why)

    async def _shows(self, engine: EngineProcess) -> None:
        """Returns once the engine's process tree uses the bytes asked (never for a whole card:
        its health check or the bound ends the hold)."""
        try:
            driver = await asyncio.to_thread(_open, self._cfg)
        except (DriverError, OSError) as e:
            log.warning("cannot read the cards while %s starts unleased (%s): the fail-open lock "
                        "is held until it answers or --start-limit passes", self.o.engine, e)
            await asyncio.Future()              # cancelled by the hold's end
            return
        try:
            while not await asyncio.to_thread(_uses, driver, self._shares, engine.proc.pid):
                await asyncio.sleep(_SHOWS_EVERY_S)
        finally:
            driver.close()

    def answered(self, engine: EngineProcess) -> None:
        """The engine answered its health check: it has loaded, the lock goes. Without a
        health check (``--health none``, no URL) the answer proves nothing and the lock stays."""
        if self.o.health != "none" and engine.url:
            self.let_go("it answers its health check")

    def let_go(self, why: str) -> None:
        """Let the fail-open lock go, once, saying why: the next run measures with this
        engine counted."""
        if self.lock is None:
            return
        self.lock.release()
        self.lock = None
        if self._gone is not None:
            self._gone.set()
        log.info("%s started unleased and %s: the fail-open lock is let go (the next berth run "
                 "measures with it counted)", self.o.engine, why)

    def _left(self, now: float) -> str:
        """How long the wait has left and what happens then, in words."""
        left = max(0.0, self.o.start_limit_s - (now - self.since))
        return (f"{left:.0f}s left of --start-limit {self.o.start_limit_s:.0f}s, then "
                f"{self.o.engine} does not start")

    def _less(self) -> str:
        """How to wait less, where a shorter wait can be given."""
        return "; --start-limit 10s waits less" if self.o.start_limit_s > 10 else ""

    def _require(self, error: Exception, now: float) -> None:
        """``--require-berthd``: say the wait at once, then every ``remind_s``."""
        if self._told_at is None:
            self._told_at = now
            log.warning("%s; waiting for it (--require-berthd: no limit; %s starts as soon as "
                        "berthd answers)", error, self.o.engine)
        elif now - self._told_at >= self.remind_s:
            self._told_at = now
            log.warning("still waiting for berthd (%.0fs so far; --require-berthd: no limit): "
                        "%s", now - self.since, error)
