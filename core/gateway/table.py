"""This machine's engines, as the gateway routes to them: from berth.toml's engine entries (a
``front`` address or a ``url``) and from runs registered with berthd under an engine name and
aliases (``berth run --engine NAME --alias ID --front ADDR``).

Source: issue 14 "What to build"; DESIGN.md "Config" and "berth status --json".

Each engine is a :class:`Route`. Its ``state`` is one of :data:`STATES`, read from berthd's
status (the lease's shares): ``active``, ``loading`` (active, but the engine has not answered
yet: issue 27, a loading engine is not ranked as ready), ``parked`` (parking, parked or
resuming), ``lent`` (lending, lent or returning), ``draining`` (draining, released, freed),
``waiting`` (its run waits for a lease), ``drained`` (no lease, but its run keeps its front,
which holds a write and starts the engine again: berthd's ``drained`` entries, issue 35),
``not running`` (no lease), or ``unknown`` (berthd cannot be reached: the gateway fails open
and routes to what berth.toml names). Reading the table never wakes anything: it is berthd's
status, read every ``interval_s``. A run's front (a lease's or a drained run's) is routed to
only when berthd checked its names and its front (issue 26: ``owner_checked``,
``front_checked``).

The table remembers every model name (and alias) a lease here has served (``seen``), so that a
request for an engine that stopped is told so (a 503), not that the name is unknown (a 404).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field

from berth.client import ApiError, BerthdUnavailable, Client
from berth.config import Config

__all__ = ["Route", "LocalTable", "STATES", "lease_state", "address_url"]

log = logging.getLogger("berth.gateway")

STATES = ("active", "lent", "loading", "parked", "waiting", "drained", "draining", "not running",
          "unknown")
#: The gap limit of an engine with no entry (the entry's ``read_timeout``), seconds.
DEFAULT_READ_TIMEOUT_S = 30.0

_PARKED = {"parking", "parked", "resuming"}
_LENT = {"lending", "lent", "returning"}
_DRAINING = {"draining", "released", "freed"}


@dataclass
class Route:
    """One engine on one machine. ``target``: the base URL requests go to (its front, else its
    own URL), ``None`` when it has none. ``queue``: requests queued or in flight for it on that
    machine (berthd's waiting entries for the engine, ``waiting``, plus the larger of the
    gateway's requests in flight to it and those its front reports, ``busy``; filled in by
    :meth:`LocalTable.snapshot`). ``loading_s``: how long a ``loading`` engine has loaded,
    seconds. ``read_timeout_s``: the gap limit of its answers, seconds. ``aliases`` is a list
    (a string would match model names by substring: refused)."""

    name: str
    aliases: list[str] = field(default_factory=list)
    target: str | None = None
    state: str = "not running"
    lease: str | None = None
    queue: int = 0
    source: str = "config"
    waiting: int = 0
    busy: int = 0
    loading_s: float = 0.0
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    def __post_init__(self) -> None:
        if not isinstance(self.aliases, list) or \
                not all(isinstance(a, str) for a in self.aliases):
            raise ValueError(f"aliases of {self.name!r}: expected a list of model names, got "
                             f"{self.aliases!r}")

    def serves(self, model: str) -> bool:
        return model == self.name or model in self.aliases

    def as_dict(self) -> dict:
        return asdict(self)


def address_url(addr: str | None) -> str | None:
    """``"host:port"`` or a URL -> a base URL without a trailing slash; ``None`` for a word such
    as ``"gateway"`` or ``"comfyui-port"`` (a front that is not an address). A described front,
    such as the ComfyUI node's ``"comfyui-node http://127.0.0.1:8188[; FLAG: ...]"``, gives the
    URL it names (read whole, it became ``http://comfyui-node http://...``)."""
    if not addr:
        return None
    words = addr.replace(";", " ").split()
    if len(words) != 1:
        urls = [w for w in words if w.startswith(("http://", "https://"))]
        return urls[0].rstrip("/") if urls else None
    addr = words[0]
    if addr.startswith(("http://", "https://")):
        return addr.rstrip("/")
    host, sep, port = addr.rpartition(":")
    if sep and port.isdigit():
        return f"http://{host or '127.0.0.1'}:{port}"
    return None


def lease_state(lease: dict) -> str:
    """A lease of berthd's status -> one of :data:`STATES` (the least serving share wins; an
    active lease whose engine has not answered yet, ``"ready": false``, is ``loading``)."""
    sts = {sh["state"] for sh in lease.get("shares", [])}
    if sts & _DRAINING:
        return "draining"
    if sts & _PARKED:
        return "parked"
    if "waiting" in sts or not sts:
        return "waiting"
    if not lease.get("ready", True):
        return "loading"
    if sts & _LENT:
        return "lent"
    return "active"


class LocalTable:
    """The routes of this machine, refreshed from berthd every ``interval_s`` seconds (and at
    once by :meth:`refresh`). ``in_flight`` counts the gateway's own requests per engine;
    ``seen`` every model name and alias a lease here has had."""

    def __init__(self, cfg: Config, client: Client, interval_s: float = 0.5):
        self.cfg = cfg
        self.client = client
        self.interval_s = interval_s
        self.routes: list[Route] = []
        self._by: dict[str, Route] = {}
        self._set(self._from_config())
        self.costs: dict[str, dict] = {}
        self.berthd_up: bool | None = None
        self.read_at = 0.0
        self.in_flight: dict[str, int] = {}
        self.seen: set[str] = set()
        self._aliases: dict[str, list[str]] = {}     # lease id -> aliases once seen
        self._loading_at: dict[str, float] = {}      # lease id -> when first seen loading
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def _from_config(self) -> list[Route]:
        # An entry with neither front nor url is listed too (issue 14: /v1/models lists every
        # engine, "not running" included); a request for it gets a 503 naming what is missing.
        return [Route(name, [], address_url(e.front) or address_url(e.url), "unknown",
                      source="config", read_timeout_s=e.read_timeout)
                for name, e in self.cfg.engines.items()]

    def _set(self, routes: list[Route]) -> None:
        by: dict[str, Route] = {}
        for r in routes:
            for name in (r.name, *r.aliases):
                by.setdefault(name, r)
        self.routes, self._by = routes, by

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self.client.close()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("gateway: reading berthd's status failed")

    async def refresh(self) -> None:
        """Read berthd's status and rebuild the routes."""
        async with self._lock:
            try:
                st = await self.client.call("GET", "/v1/status", timeout_s=5.0)
            except (BerthdUnavailable, ApiError, asyncio.TimeoutError) as e:
                if self.berthd_up is not False:
                    log.warning("gateway: berthd cannot be read (%s); routing by berth.toml and "
                                "the runs last seen", e)
                self.berthd_up = False
                # A run's front keeps forwarding while berthd is down (fail-open), so its route
                # stays; dropping it answered 404 "served by no engine" for a running engine.
                routes = {r.name: r for r in self._from_config()}
                routes.update({r.name: r for r in self.routes if r.source == "run" and r.target})
                self._set(list(routes.values()))
                self.read_at = time.monotonic()
                return
            self.berthd_up = True
            self._set(self._build(st))
            self.costs = dict(st.get("switch_costs") or {})
            self.read_at = time.monotonic()

    def _build(self, st: dict) -> list[Route]:
        waiting: dict[str, int] = {}
        for w in st.get("waiting", []):
            waiting[w["engine"]] = waiting.get(w["engine"], 0) + 1
        routes: dict[str, Route] = {}
        for r in self._from_config():
            r.state = "not running"
            routes[r.name] = r
        now = time.monotonic()
        live = set()
        for le in st.get("leases", []):
            if not (le.get("owner_checked") and le.get("front_checked")):
                continue            # berthd: not the name's owner, or a front elsewhere (issue 26)
            live.add(le["id"])
            self._lease_route(le, routes, now)
        for row in st.get("drained", []):
            if row.get("owner_checked") and row.get("front_checked"):
                self._drained_route(row, routes)
        self._aliases = {k: v for k, v in self._aliases.items() if k in live}
        self._loading_at = {k: v for k, v in self._loading_at.items() if k in live}
        for r in routes.values():
            r.waiting = waiting.get(r.name, 0)
        return list(routes.values())

    def _lease_route(self, le: dict, routes: dict[str, Route], now: float) -> None:
        """Put one lease of berthd's status in ``routes`` (a run's front over an entry's)."""
        name = le["engine"]
        got = le.get("aliases")
        aliases = list(got) if isinstance(got, list) else self._aliases.get(le["id"], [])
        aliases = [a for a in aliases if isinstance(a, str)]
        self._aliases[le["id"]] = aliases
        self.seen.update((name, *aliases))
        target = address_url((le.get("capabilities") or {}).get("front"))
        state = lease_state(le)
        if state == "loading":
            since = self._loading_at.setdefault(le["id"], now)
        else:
            self._loading_at.pop(le["id"], None)
            since = now
        r = routes.get(name)
        if r is None or (r.source == "run" and _better(state, r.state)) or r.source == "config":
            e = self.cfg.engines.get(name)
            keep_target = r.target if r is not None else None
            routes[name] = Route(name, aliases, target or keep_target, state, le["id"],
                                 source="run" if target else (r.source if r else "run"),
                                 busy=int(le.get("in_flight") or 0), loading_s=now - since,
                                 read_timeout_s=e.read_timeout if e is not None
                                 else DEFAULT_READ_TIMEOUT_S)

    def _drained_route(self, row: dict, routes: dict[str, Route]) -> None:
        """Put one drained run of berthd's status in ``routes``: its kept front takes the
        engine's requests (issue 35), unless a lease of the engine routes somewhere already
        (the run's new lease, once a write made it ask)."""
        target = address_url(row.get("front"))
        if not target:
            return
        name = row["engine"]
        got = row.get("aliases")
        aliases = [a for a in got if isinstance(a, str)] if isinstance(got, list) else []
        self.seen.update((name, *aliases))
        r = routes.get(name)
        if r is not None and r.source == "run" and r.target:
            return
        e = self.cfg.engines.get(name)
        routes[name] = Route(name, aliases, target, "drained", None, source="run",
                             busy=int(row.get("waiters") or 0),
                             read_timeout_s=e.read_timeout if e is not None
                             else DEFAULT_READ_TIMEOUT_S)

    def find(self, model: str) -> Route | None:
        return self._by.get(model)

    def knows(self, model: str) -> bool:
        """Whether ``model`` was ever served here (a lease's name or alias) or has an entry."""
        return model in self.seen or model in self.cfg.engines

    def queue(self, r: Route) -> int:
        """Requests queued or in flight for ``r`` now."""
        return r.waiting + max(self.in_flight.get(r.name, 0), r.busy)

    def snapshot(self) -> list[dict]:
        """The routes as dicts, queues up to date (for ``/v1/models`` and peers)."""
        out = []
        for r in self.routes:
            r.queue = self.queue(r)
            out.append(r.as_dict())
        return out


_RANK = {s: i for i, s in enumerate(STATES)}


def _better(a: str, b: str) -> bool:
    return _RANK.get(a, 99) < _RANK.get(b, 99)
