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
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from berth import paths
from berth.decide.units import format_size as fmt_bytes
from berth.decide.units import parse_size
from berth.driver.base import Driver, DriverError

__all__ = ["Room", "measure", "FailOpen"]

log = logging.getLogger("berth.run")


@dataclass(frozen=True)
class Room:
    """:func:`measure`'s verdict. ``fits``: the engine may start unleased; ``why``: one line
    for the log either way; ``cards``: where it runs (``{"pci", "name", "uuid", "bytes"}``, as a
    grant gives them); ``driver``: ``{"kind", "sim_dir"}``, as a grant gives it."""

    fits: bool
    why: str
    cards: list[dict] = field(default_factory=list)
    driver: dict = field(default_factory=dict)


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


def measure(o) -> Room:
    """Whether the run ``o`` (:class:`~berth.run.cli.RunOptions`) may start its engine unleased
    now (see the module docstring). Blocking (reads berth.toml and the driver): call it in a
    thread. Never raises."""
    from berth.config import ConfigError, load_config
    try:
        cfg, _ = load_config(None)
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
    cards = []
    for ask in asks:
        pci, why = _place(ask, infos, names, reads, reserves, taken)
        if pci is None:
            return Room(False, why)
        size = ask[1] if ask[1] is not None else reads[pci].free_bytes - reserves[pci]
        taken[pci] = taken.get(pci, 0) + size
        uuid = next(c.uuid for c in infos if c.pci == pci)
        cards.append({"pci": pci, "name": names[pci], "uuid": uuid, "bytes": size})
    said = ", ".join(f"{fmt_bytes(c['bytes'])} on {c['name']}" for c in cards)
    kind = {"kind": driver.kind,
            "sim_dir": str(paths.sim_dir(cfg)) if cfg.driver.kind == "sim" else None}
    return Room(True, f"it fits beside what the cards hold ({said}, reserve kept)", cards, kind)


class FailOpen:
    """The run's side of berthd being unreachable at start (see the module docstring):
    :meth:`step` after each failed attempt to reach berthd. ``every_s``: seconds between two
    measures; ``o.start_limit_s``: how long the run waits for berthd when it does not fit;
    ``remind_s``: seconds between two reminders of the wait (what it waits for, how long is
    left, what the user can do), the first said at once; ``clock``: monotonic seconds."""

    def __init__(self, o, every_s: float = 5.0, remind_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic):
        self.o = o
        self.every_s = every_s
        self.remind_s = remind_s
        self.clock = clock
        self.since: float | None = None
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
        if self._measured_at is None or now - self._measured_at >= self.every_s:
            self._measured_at = now
            room = await asyncio.to_thread(measure, self.o)
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
            log.warning("still waiting for berthd (%s%s): %s; %s does not start unleased: %s",
                        self._left(now), self._less(), str(error).rstrip("."), self.o.engine,
                        (self._said or "").split(". ")[0])
        return False

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
