"""Other machines' gateways: what each serves, in what state, at what switch cost.

Source: issue 14 "Many machines"; seed 002 "Many machines" (no shared state, no consensus: each
gateway asks the others, each berthd stays the only authority for its own cards).

Every ``poll_s`` each peer is asked, with a signed ``GET /berth/v1/peer/engines`` bounded by
``timeout_s``, for its machine name, its routes (:class:`berth.gateway.table.Route` as dicts)
and its measured switch costs. A peer that does not answer in time, or refuses, is marked down:
it is skipped until ``retry_s`` has passed, then asked again; its last known routes are kept so a
request for its models gets a clear 503 rather than a 404. A forward that cannot reach a peer
marks it down at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from berth.gateway.signing import sign
from berth.gateway.table import Route

__all__ = ["Peer", "Peers", "ENGINES_PATH"]

log = logging.getLogger("berth.gateway")

ENGINES_PATH = "/berth/v1/peer/engines"


@dataclass
class Peer:
    """One peer gateway. ``url``: its base URL. ``machine``: its name (learned from its answer;
    the URL until then). ``up``: it answered the last call. ``down_since``/``retry_at``:
    monotonic seconds. ``gone``: a future set when it is marked down (a forward waiting on it
    gives up)."""

    url: str
    machine: str = ""
    routes: list[Route] = field(default_factory=list)
    costs: dict[str, dict] = field(default_factory=dict)
    up: bool = False
    asked: bool = False
    error: str = ""
    retry_at: float = 0.0
    answered_at: float | None = None
    gone: asyncio.Future | None = None

    def as_dict(self) -> dict:
        return {"url": self.url, "machine": self.machine or self.url, "up": self.up,
                "error": self.error or None, "switch_costs": self.costs,
                "answered_s_ago": None if self.answered_at is None
                else round(time.monotonic() - self.answered_at, 2)}


class Peers:
    """The peers of one gateway. ``me``: this machine's name (sent with every call)."""

    def __init__(self, urls: list[str], key: str, me: str, *, timeout_s: float = 1.0,
                 retry_s: float = 5.0, poll_s: float = 1.0):
        self.key, self.me = key, me
        self.timeout_s, self.retry_s, self.poll_s = timeout_s, retry_s, poll_s
        self.peers = [Peer(u.rstrip("/")) for u in urls]
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        loop = asyncio.get_running_loop()
        for p in self.peers:
            p.gone = loop.create_future()
        await asyncio.gather(*(self._ask(p) for p in self.peers))
        self._task = loop.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def signed(self, method: str, path_qs: str, body: bytes = b"") -> dict[str, str]:
        """The signature headers for one call from this machine."""
        return sign(self.key, self.me, method, path_qs, body)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            now = time.monotonic()
            due = [p for p in self.peers if p.up or now >= p.retry_at]
            if due:
                await asyncio.gather(*(self._ask(p) for p in due))

    async def _ask(self, p: Peer) -> None:
        assert self._session is not None
        try:
            async with self._session.get(
                    p.url + ENGINES_PATH, headers=self.signed("GET", ENGINES_PATH),
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                text = await r.text()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {text[:200]}")
                doc = json.loads(text)
            p.machine = str(doc.get("machine") or p.url)
            p.routes = [Route(**{k: v for k, v in d.items() if k in Route.__dataclass_fields__})
                        for d in doc.get("engines", [])]
            p.costs = dict(doc.get("switch_costs") or {})
            if not p.up:
                log.info("gateway: peer %s (%s) answers", p.machine, p.url)
            p.up, p.error, p.answered_at = True, "", time.monotonic()
            if p.gone is None or p.gone.done():
                p.gone = asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.mark_down(p, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        finally:
            p.asked = True

    def mark_down(self, p: Peer, why: str) -> None:
        """Skip ``p`` until ``retry_s`` has passed; forwards waiting on it give up."""
        if p.up or not p.error:
            log.warning("gateway: peer %s is down: %s (retry in %g s)", p.machine or p.url, why,
                        self.retry_s)
        p.up, p.error = False, why
        p.retry_at = time.monotonic() + self.retry_s
        if p.gone is not None and not p.gone.done():
            p.gone.set_result(why)

    def candidates(self, model: str) -> list[tuple[Peer, Route]]:
        """Every (peer, route) known to serve ``model``, peers down included (the caller skips
        those and says so)."""
        return [(p, r) for p in self.peers for r in p.routes if r.serves(model)]
