"""What the web board shows, kept in one place: the latest board snapshot, the last events, an
hour of history, and the wait times. Every page's event stream reads from one :class:`Hub`.

Source: issue 15 (the board in a browser); seed 000 (its counters watched over time: waits
with some memory free but not enough, preemptions by kind, the reserve's fraction).

A hub reads a :class:`Source`: berthd's own broker (:class:`BrokerSource`, in the daemon) or
berthd's control socket (:class:`SocketSource`, for the gateway, which runs in its own process).
It follows the timeline (long poll), so a grant, park or wake reaches the pages within one event
loop turn; between events it re-reads the board every ``tick_s`` (reads of the cards change
without a timeline note). History is bounded: one sample every ``sample_s`` for ``window_s``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from typing import Any, Protocol

__all__ = ["Hub", "Source", "BrokerSource", "SocketSource", "WaitTimes", "EVENT_KINDS"]

log = logging.getLogger("berth.daemon.board_web")

#: Timeline kinds the board lists as events (grants, parks, wakes, lends, drains, fallbacks and
#: what an operator did); the rest (attach, touch-level notes) stay in ``berth timeline``.
EVENT_KINDS = frozenset({
    "request", "grant", "wait", "plan", "park", "parked", "park.off", "park.none", "resume", "wake", "wake.none",
    "lend", "lent", "return", "returning", "drain", "drain.overdue", "fallback", "never",
    "rejected", "exit", "freed", "hold", "ready", "over_lease", "lease.unparked", "extend",
    "operator"})

#: Wait-time histogram buckets, seconds (a grant at once up to a long queue).
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Source(Protocol):
    """Where a hub reads berthd. ``status()`` is ``berth status --json``'s dict; ``timeline``
    returns entries with ``seq > after`` (waiting up to ``timeout_s``); ``operator`` carries out
    an operator action and returns the API's answer (raises ``KeyError`` for an unknown target,
    ``ValueError`` for a refused one); ``metrics`` is berthd's Prometheus text (bytes), its
    wait-time histogram from ``waits``."""

    async def status(self) -> dict: ...
    async def timeline(self, after: int, timeout_s: float) -> list[dict]: ...
    async def operator(self, op: str, target: str) -> dict: ...
    async def metrics(self, waits: "WaitTimes") -> bytes: ...


class BrokerSource:
    """A hub's source inside berthd: the broker itself."""

    def __init__(self, broker):
        self.broker = broker
        self._registry = None

    async def status(self) -> dict:
        st = self.broker.status()
        kept = getattr(self.broker, "costs", None)      # issue 14's measured switch costs
        if kept is not None and "switch_costs" not in st:
            st["switch_costs"] = kept.as_json()
        return st

    async def timeline(self, after: int, timeout_s: float) -> list[dict]:
        return await self.broker.wait_timeline(after, timeout_s)

    async def operator(self, op: str, target: str) -> dict:
        # berthd's parts load in berthd only
        from berth.daemon.drained import find_target, wake_drained
        b = self.broker
        woken = wake_drained(b, target) if op == "wake" else None
        if woken is not None:
            return woken
        lease = find_target(b, target, op)
        fx = await b.submit(lambda now: b.sched.operator(op, lease.id, now))
        return {"lease": lease.id, "engine": lease.engine, "op": op,
                "notes": [e.text for e in fx if hasattr(e, "text")]}

    async def metrics(self, waits: "WaitTimes") -> bytes:
        """The figures the control API's ``/metrics`` gives (the same collectors)."""
        from berth.daemon.api_metrics import registry  # berthd's parts load in berthd only
        from prometheus_client import generate_latest
        if self._registry is None:
            self._registry = registry(self.broker, waits)
        return generate_latest(self._registry)


class SocketSource:
    """A hub's source outside berthd (the gateway): the control API on its Unix socket."""

    def __init__(self, socket_path: str):
        self.socket_path = str(socket_path)
        self._session = None

    def _s(self):
        import aiohttp
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=2))
        return self._session

    async def _json(self, method: str, path: str, **kw) -> dict:
        async with self._s().request(method, "http://berthd" + path, **kw) as r:
            doc = await r.json(content_type=None)
            if r.status == 404:
                raise KeyError(doc.get("error") or path)
            if r.status >= 400:
                raise ValueError(doc.get("error") or f"HTTP {r.status}")
            return doc

    async def status(self) -> dict:
        return await self._json("GET", "/v1/status")

    async def timeline(self, after: int, timeout_s: float) -> list[dict]:
        doc = await self._json("GET", f"/v1/timeline?after={after}&timeout={timeout_s}")
        return doc["entries"]

    async def operator(self, op: str, target: str) -> dict:
        return await self._json("POST", f"/v1/operator/{op}", json={"target": target})

    async def metrics(self, waits: "WaitTimes") -> bytes:
        """berthd's own ``/metrics`` (its wait times, not this process's ``waits``)."""
        async with self._s().get("http://berthd/metrics") as r:
            if r.status >= 400:
                raise ValueError(f"berthd's /metrics answered HTTP {r.status}")
            return await r.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class WaitTimes:
    """How long requests waited for their grant or their wake, from timeline notes: a wait
    starts at ``request`` (or a ``wake`` that has to wait for room) and ends at ``grant`` (or
    ``resume``); one that ends otherwise (``never``, ``rejected``, ``exit``) is dropped.
    Seconds, on the broker's monotonic clock (the notes' ``at``)."""

    def __init__(self, buckets: tuple[float, ...] = WAIT_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = {k: [0] * (len(self.buckets) + 1) for k in ("grant", "resume")}
        self.sums = {k: 0.0 for k in self.counts}
        self._open: dict[tuple[str, str], float] = {}

    def feed(self, e: dict) -> float | None:
        """Take one timeline entry; the wait it ended (seconds), if any."""
        lid, kind, at = e.get("lease"), e.get("kind"), e.get("at")
        if not lid or at is None:
            return None
        if kind == "request":
            self._open[(lid, "grant")] = at
        elif kind == "wake" and "waiting for room" in (e.get("text") or ""):
            self._open.setdefault((lid, "resume"), at)
        elif kind in ("grant", "resume"):
            start = self._open.pop((lid, kind), None)
            if start is not None and at >= start:
                self.observe(kind, at - start)
                return at - start
        elif kind in ("never", "rejected", "exit", "freed"):
            self._open.pop((lid, "grant"), None)
            self._open.pop((lid, "resume"), None)
        return None

    def observe(self, kind: str, seconds: float) -> None:
        i = next((i for i, b in enumerate(self.buckets) if seconds <= b), len(self.buckets))
        self.counts[kind][i] += 1
        self.sums[kind] += seconds

    def expected_s(self, kind: str) -> float | None:
        """The mean wait of ``kind`` so far, or ``None`` before the first."""
        n = sum(self.counts.get(kind, ()))
        return round(self.sums[kind] / n, 3) if n else None


#: How long a hub without pages waits on the timeline at a time (seconds): a new note ends the
#: wait at once, so only the number of wake-ups when nothing happens depends on it.
_NO_PAGES_WAIT_S = 60.0


class Hub:
    """The board's shared state. ``snapshot`` is what a page draws; ``version`` grows with each
    change; :meth:`changed` waits for the next. ``window_s``/``sample_s`` bound the history.
    ``pages=False``: no page will read it (berthd's ``[board] listen = "off"``): it follows the
    timeline for :attr:`waits` (the metrics') and re-reads no board."""

    def __init__(self, source: Source, *, window_s: float = 3600.0, sample_s: float = 5.0,
                 tick_s: float = 1.0, events: int = 60, pages: bool = True):
        self.source = source
        self.pages = pages
        self.window_s, self.sample_s, self.tick_s = window_s, sample_s, tick_s
        self.history: collections.deque[dict] = collections.deque(
            maxlen=max(2, int(window_s / sample_s) + 1))
        self.events: collections.deque[dict] = collections.deque(maxlen=events)
        self.waits = WaitTimes()
        self.snapshot: dict | None = None
        self.version = 0
        self.up = False
        self.closing = False
        self._seq = 0
        self._last_json = ""
        self._last_sample = 0.0
        self._cond = asyncio.Condition()
        self._task: asyncio.Task | None = None

    # -- life ------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the reader and every stream waiting on the hub."""
        self.closing = True
        await self._notify()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        close = getattr(self.source, "close", None)
        if close is not None:
            await close()

    async def changed(self, seen: int, timeout_s: float) -> int:
        """Wait until ``version > seen`` (or the hub closes, or ``timeout_s``); the version."""
        async with self._cond:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cond.wait_for(
                    lambda: self.version > seen or self.closing), timeout_s)
        return self.version

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    # -- the reader ------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self.closing:
            try:
                if not self.pages:
                    # A board no page reads, re-read every tick, was a tenth of an idle
                    # berthd's CPU: only the timeline's notes count (the wait times).
                    for e in await self.source.timeline(self._seq, _NO_PAGES_WAIT_S):
                        self._take(e)
                    continue
                entries = await self.source.timeline(self._seq, self.tick_s if self.up else 0)
                for e in entries:
                    self._take(e)
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:          # berthd away (gateway): show it, try again
                if self.up:
                    log.warning("board: berthd cannot be read: %s", e)
                self.up = False
                await asyncio.sleep(self.tick_s)

    def _take(self, e: dict) -> None:
        if e["seq"] <= self._seq:
            return
        self._seq = e["seq"]
        self.waits.feed(e)
        if e.get("kind") in EVENT_KINDS:
            self.events.append({"seq": e["seq"], "t": e.get("t"), "wall": time.time(),
                                "lease": e.get("lease"), "engine": e.get("engine"),
                                "kind": e.get("kind"), "text": e.get("text")})

    def note_operator(self, who: str, addr: str, op: str, target: str, answer: str) -> None:
        """Show what an operator did among the events (the log has it too)."""
        self.events.append({"seq": None, "t": None, "wall": time.time(), "lease": None,
                            "engine": target, "kind": "operator",
                            "text": f"{op} {target} by {who} from {addr}: {answer}"})

    async def refresh(self) -> None:
        """Re-read the board; bump the version when anything a page shows changed."""
        st = await self.source.status()
        self.up = True
        now = time.time()
        if now - self._last_sample >= self.sample_s or not self.history:
            self._last_sample = now
            self.history.append(_sample(st, now))
        snap = self._compose(st)
        text = json.dumps(snap, sort_keys=True, default=str)
        if text != self._last_json:
            self._last_json = text
            self.snapshot = snap
            self.version += 1
            await self._notify()

    def _compose(self, st: dict) -> dict:
        for w in st.get("waiting", []):
            # The mean wait so far, less what this waiter already waited; unknown (None) when
            # it has already waited longer than the mean (the mean says nothing about it then).
            exp = self.waits.expected_s(w.get("kind", "grant"))
            left = None if exp is None else round(exp - w.get("waited_s", 0), 3)
            w["expected_wait_s"] = left if left is not None and left > 0 else None
        return {"status": st, "events": list(self.events)[-30:],
                "history": {"sample_s": self.sample_s, "window_s": self.window_s,
                            "last": self.history[-1] if self.history else None}}

    def full_history(self) -> list[dict]:
        return list(self.history)


def _sample(st: dict, now: float) -> dict[str, Any]:
    """One history point: each card's counted bytes by engine, and the seed 000 counters."""
    cards = {}
    for c in st.get("cards", []):
        by: dict[str, int] = {}
        for sh in c.get("shares", []):
            by[sh["engine"]] = by.get(sh["engine"], 0) + int(sh.get("counted_bytes") or 0)
        cards[c["name"]] = {"total": c.get("total_bytes"), "engines": by}
    return {"wall": round(now, 3), "cards": cards, "counters": dict(st.get("counters", {}))}
