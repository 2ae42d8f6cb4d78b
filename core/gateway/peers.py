"""Other machines' gateways: what each serves, in what state, at what switch cost and round trip.

Source: issue 14 "Many machines"; seed 002 "Many machines" (no shared state, no consensus: each
gateway asks the others, each berthd stays the only authority for its own cards); issue 26
"Low" (peer answers validated by a schema; a peer's ``aliases`` given as a string matched model
names by substring); issue 27 (the round trip counts in the ranking; a peer marked down ends its
relays at once).

Every ``poll_s`` each peer is asked, with a signed ``GET /berth/v1/peer/engines`` bounded by
``timeout_s``, for its machine name, its routes and its measured switch costs; the answer must
match :class:`PeerAnswer`, else the peer is marked down with the reason. A peer that does not
answer in time, or refuses, is marked down: it is skipped until ``retry_s`` has passed, then
asked again; its last known routes are kept so a request for its models gets a clear 503 rather
than a 404. ``on_down(peer, why)`` is called when a peer is marked down (the gateway ends its
relays to it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

import aiohttp
from berth.front.upstream import Address
from berth.gateway.signing import EMPTY_DIGEST, sign
from berth.gateway.table import DEFAULT_READ_TIMEOUT_S, Route
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

__all__ = ["Peer", "Peers", "ENGINES_PATH", "PeerAnswer", "new_session"]

log = logging.getLogger("berth.gateway")

ENGINES_PATH = "/berth/v1/peer/engines"
_RTT_KEEP = 0.7     # weight of the old round trip in the smoothed one


class PeerRoute(BaseModel):
    """One engine of a peer, as its gateway lists it (:class:`berth.gateway.table.Route`)."""

    model_config = ConfigDict(extra="ignore")
    name: StrictStr = Field(min_length=1, max_length=200)
    aliases: list[StrictStr] = Field(default_factory=list, max_length=100)
    target: StrictStr | None = None
    state: Literal["active", "lent", "loading", "parked", "waiting", "drained", "draining",
                   "not running", "unknown"] = "unknown"
    queue: int = Field(0, ge=0)
    loading_s: float = Field(0.0, ge=0)
    read_timeout_s: float = Field(DEFAULT_READ_TIMEOUT_S, gt=0)


class PeerCosts(BaseModel):
    """A peer's measured switch costs for one engine, seconds (None: not measured yet)."""

    model_config = ConfigDict(extra="allow")
    park_s: float | None = Field(None, ge=0)
    restore_s: float | None = Field(None, ge=0)
    cold_start_s: float | None = Field(None, ge=0)


class PeerAnswer(BaseModel):
    """What ``GET /berth/v1/peer/engines`` answers."""

    model_config = ConfigDict(extra="ignore")
    machine: StrictStr = Field(min_length=1, max_length=100)
    engines: list[PeerRoute] = Field(max_length=10000)
    switch_costs: dict[str, PeerCosts] = Field(default_factory=dict)


def new_session(connect_timeout_s: float = 10.0) -> aiohttp.ClientSession:
    """A client session for peer polls and websockets: no decompression, no cookies."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0),
        auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))


@dataclass(eq=False)
class Peer:
    """One peer gateway. ``url``: its base URL; ``addr`` the same for the relays. ``machine``:
    its name (learned from its answer; empty until then). ``up``: it answered the last call.
    ``rtt_s``: the smoothed round trip of its answers, seconds. ``retry_at``: monotonic s."""

    url: str
    machine: str = ""
    routes: list[Route] = field(default_factory=list)
    costs: dict[str, dict] = field(default_factory=dict)
    up: bool = False
    asked: bool = False
    error: str = ""
    retry_at: float = 0.0
    answered_at: float | None = None
    rtt_s: float | None = None
    addr: Address | None = None

    def __post_init__(self) -> None:
        self.addr = Address(self.url)

    def as_dict(self) -> dict:
        return {"url": self.url, "machine": self.machine or self.url, "up": self.up,
                "error": self.error or None, "switch_costs": self.costs,
                "rtt_s": None if self.rtt_s is None else round(self.rtt_s, 4),
                "answered_s_ago": None if self.answered_at is None
                else round(time.monotonic() - self.answered_at, 2)}


class Peers:
    """The peers of one gateway. ``me``: this machine's name (sent with every call)."""

    def __init__(self, urls: list[str], key: str, me: str, *, timeout_s: float = 1.0,
                 retry_s: float = 5.0, poll_s: float = 1.0,
                 on_down: Callable[[Peer, str], None] | None = None):
        self.key, self.me = key, me
        self.timeout_s, self.retry_s, self.poll_s = timeout_s, retry_s, poll_s
        self.peers = [Peer(u.rstrip("/")) for u in urls]
        self.on_down = on_down
        self.seen: set[str] = set()          # every model name and alias a peer listed
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        await asyncio.gather(*(self._ask(p) for p in self.peers))
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def signed(self, p: Peer, method: str, path_qs: str, digest: str) -> dict[str, str]:
        """The signature headers for one call from this machine to ``p``."""
        return sign(self.key, self.me, method, path_qs, to=p.machine, digest=digest)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            now = time.monotonic()
            due = [p for p in self.peers if p.up or now >= p.retry_at]
            if due:
                await asyncio.gather(*(self._ask(p) for p in due))

    async def _ask(self, p: Peer) -> None:
        assert self._session is not None
        t0 = time.monotonic()
        try:
            async with self._session.get(
                    p.url + ENGINES_PATH, headers=self.signed(p, "GET", ENGINES_PATH,
                                                              EMPTY_DIGEST),
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                text = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {text[:200]!r}")
            got = PeerAnswer.model_validate_json(text)
            self._learn(p, got, time.monotonic() - t0)
        except asyncio.CancelledError:
            raise
        except ValidationError as e:
            self.mark_down(p, f"its answer does not match the schema: {_first(e)}")
        except Exception as e:
            self.mark_down(p, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        finally:
            p.asked = True

    def _learn(self, p: Peer, got: PeerAnswer, rtt_s: float) -> None:
        p.machine = got.machine
        p.routes = [Route(r.name, list(r.aliases), r.target, r.state, queue=r.queue,
                          loading_s=r.loading_s, read_timeout_s=r.read_timeout_s,
                          source="peer") for r in got.engines]
        p.costs = {k: v.model_dump() for k, v in got.switch_costs.items()}
        for r in p.routes:
            self.seen.update((r.name, *r.aliases))
        p.rtt_s = rtt_s if p.rtt_s is None else _RTT_KEEP * p.rtt_s + (1 - _RTT_KEEP) * rtt_s
        if not p.up:
            log.info("gateway: peer %s (%s) answers", p.machine, p.url)
        p.up, p.error, p.answered_at = True, "", time.monotonic()

    def mark_down(self, p: Peer, why: str) -> None:
        """Skip ``p`` until ``retry_s`` has passed; its relays end (``on_down``)."""
        if p.up or not p.error:
            log.warning("gateway: peer %s is down: %s (retry in %g s)", p.machine or p.url, why,
                        self.retry_s)
        was_up = p.up
        p.up, p.error = False, why
        p.retry_at = time.monotonic() + self.retry_s
        if was_up and self.on_down is not None:
            self.on_down(p, why)

    def candidates(self, model: str) -> list[tuple[Peer, Route]]:
        """Every (peer, route) known to serve ``model``, peers down included (the caller skips
        those and says so)."""
        return [(p, r) for p in self.peers for r in p.routes if r.serves(model)]


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"])
    from berth.config.errors import in_words
    return f"{where}: {in_words(err)} (got {str(err.get('input'))[:60]!r})" + \
        (f", and {e.error_count() - 1} more" if e.error_count() > 1 else "")
