"""What berthd keeps for the processes that listen to it: one channel per lease (the grant, the
instructions not yet reported on) and the timeline. Long polls of the control API wait here.

Source: issue 4 "The broker loop" (instructions kept until reported, re-sent on reconnect);
DESIGN.md "timeline". Touched only from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from berth.decide.effects import Granted, Instruct
from berth.decide.model import Op

__all__ = ["LeaseGone", "Channel", "HostNotes", "Timeline", "set_waits"]


class LeaseGone(Exception):
    """The lease ended or was rejected; ``reason`` says why."""

    def __init__(self, lease_id: str, reason: str):
        super().__init__(f"lease {lease_id}: {reason}")
        self.lease_id, self.reason = lease_id, reason


def _notify(cond: asyncio.Condition) -> None:
    async def notify():
        async with cond:
            cond.notify_all()
    asyncio.get_running_loop().create_task(notify())


@dataclass
class Channel:
    """What berthd keeps per lease for the process that holds it: the grant future, the
    instructions not yet reported on, and a condition streams wait on."""

    grant: asyncio.Future
    pending: list[Instruct] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    ended: str | None = None
    version: int = 0
    #: Why the lease (or its wake) waits, as ``{"why", "lasting", "version"}``; the version
    #: grows on every change so a long poll can return when it changes (issue 12 case 6).
    wait: dict = field(default_factory=lambda: {"why": None, "lasting": False, "version": 0})

    def set_wait(self, why: str | None, lasting: bool) -> None:
        """Record the lease's wait; wake the polls waiting on this channel if it changed."""
        if (why, lasting) != (self.wait["why"], self.wait["lasting"]):
            self.wait = {"why": why, "lasting": lasting, "version": self.wait["version"] + 1}
            self.touch()

    @classmethod
    def new(cls) -> "Channel":
        return cls(grant=asyncio.get_running_loop().create_future())

    def touch(self) -> None:
        """Something changed: wake the streams waiting on this channel."""
        self.version += 1
        _notify(self.changed)

    def send(self, e: Instruct) -> None:
        """Queue an instruction until reported; a drain replaces every other (they are moot)."""
        if e.op is Op.DRAIN:
            self.pending = [i for i in self.pending if i.op is Op.DRAIN]
        self.pending.append(e)
        self.touch()

    def grant_now(self, e: Granted) -> None:
        if not self.grant.done():
            self.grant.set_result(e)

    def end(self, lease_id: str, reason: str) -> None:
        """The lease is over: a grant still awaited fails with :class:`LeaseGone`."""
        self.ended = self.ended or reason
        if not self.grant.done():
            self.grant.set_exception(LeaseGone(lease_id, reason))
        self.touch()

    def reject(self, lease_id: str, reason: str) -> None:
        """The lease was refused: a grant still awaited fails with :class:`LeaseGone`."""
        self.ended = f"rejected: {reason}"
        if not self.grant.done():
            self.grant.set_exception(LeaseGone(lease_id, self.ended))

    def reported(self, op: str) -> None:
        self.pending = [i for i in self.pending if i.op != op]

    async def wait_grant(self, timeout_s: float, closing: Callable[[], bool],
                         wait_version: int | None = None) -> Granted | None:
        """The grant, or ``None`` after ``timeout_s`` (or when berthd closes, or, given
        ``wait_version``, as soon as the wait's version differs from it). Raises
        :class:`LeaseGone`."""
        async def wait_changed():
            async with self.changed:
                await self.changed.wait_for(lambda: self.wait["version"] != wait_version
                                            or closing())
        try:
            if wait_version is None or self.grant.done():
                return await asyncio.wait_for(asyncio.shield(self.grant), timeout_s)
            changed = asyncio.ensure_future(wait_changed())
            shielded = asyncio.shield(self.grant)
            try:
                done, _ = await asyncio.wait({shielded, changed}, timeout=timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                # The shield's own future: left pending, it took the grant's LeaseGone later
                # and asyncio logged it as never retrieved (issue 36); done, it is read here.
                if shielded.done():
                    if not shielded.cancelled():
                        shielded.exception()
                else:
                    shielded.cancel()
            if self.grant.done() and not self.grant.cancelled():
                return self.grant.result()
            if self.grant.cancelled() and not closing():
                self.grant = asyncio.get_running_loop().create_future()
            return None
        except (TimeoutError, asyncio.CancelledError):
            if self.grant.cancelled() and not closing():
                self.grant = asyncio.get_running_loop().create_future()
            if asyncio.current_task().cancelling():
                raise
            return None

    async def wait_instructions(self, after_seq: int, timeout_s: float,
                                closing: Callable[[], bool], wait_version: int | None = None
                                ) -> tuple[list[Instruct], str | None]:
        """Instructions with ``seq > after_seq`` not yet reported, waiting up to
        ``timeout_s`` for one (or, given ``wait_version``, for the wait to change). Returns
        ``(instructions, ended_reason_or_None)``."""
        def ready():
            return [i for i in self.pending if i.seq > after_seq]

        def moved():
            return wait_version is not None and self.wait["version"] != wait_version
        async with self.changed:
            if not ready() and self.ended is None and not closing() and not moved():
                try:
                    await asyncio.wait_for(self.changed.wait_for(
                        lambda: bool(ready()) or self.ended is not None or closing()
                        or moved()), timeout_s)
                except TimeoutError:
                    pass
        return ready(), self.ended


def set_waits(channels: dict[str, Channel], sched) -> None:
    """Tell each live lease's channel why it waits (``sched.wait_cause``), so the polls waiting
    on it return when that changes (issue 12 case 6)."""
    for lid, ch in channels.items():
        if ch.ended is None:
            why, lasting = sched.wait_cause(lid) if lid in sched.ledger.leases else (None, False)
            ch.set_wait(why, lasting)


class Timeline:
    """The timeline: the last ``maxlen`` entries, each a dict with a growing ``seq``."""

    def __init__(self, maxlen: int = 2000):
        self.entries: collections.deque[dict] = collections.deque(maxlen=maxlen)
        self._seq = itertools.count(1)
        self._cond = asyncio.Condition()

    def add(self, entry: dict) -> dict:
        entry = {"seq": next(self._seq), **entry}
        self.entries.append(entry)
        _notify(self._cond)
        return entry

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def wake_all(self) -> None:
        """End every wait now (berthd closes)."""
        _notify(self._cond)

    async def wait(self, after_seq: int, timeout_s: float,
                   closing: Callable[[], bool]) -> list[dict]:
        """Entries with ``seq > after_seq``, waiting up to ``timeout_s`` for one."""
        def newer():
            return [x for x in self.entries if x["seq"] > after_seq]
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(
                    lambda: bool(newer()) or closing()), timeout_s)
            except TimeoutError:
                pass
        return newer()


class HostNotes:
    """What hosts said about engines no lease carries (a supervisord program that died for lack
    of memory; issue 37): the newest per engine, for the last :attr:`KEEP` engines, shown by
    ``berth status`` (``host_notes``) and put in the timeline."""

    KEEP = 32

    def __init__(self) -> None:
        self._by_engine: dict[str, dict] = {}

    def add(self, engine: str, text: str, by: str, timeline: "Timeline", t: float,
            now: float) -> None:
        """Keep ``text`` about ``engine`` (from ``by``, words); ``t``: seconds since berthd
        started, ``now``: its clock."""
        self._by_engine.pop(engine, None)
        self._by_engine[engine] = {"engine": engine, "text": text, "by": by, "at": time.time()}
        while len(self._by_engine) > self.KEEP:
            self._by_engine.pop(next(iter(self._by_engine)))
        timeline.add({"t": round(t, 3), "at": now, "lease": None, "engine": engine,
                      "kind": "host.note", "text": f"{engine}: {text}"})

    def values(self) -> list[dict]:
        return list(self._by_engine.values())
