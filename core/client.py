"""A client for berthd's control API (used by the CLI, ``berth run`` and host plugins).

Every call raises :class:`BerthdUnavailable` when berthd cannot be reached (so callers can fail
open), :class:`ConfigUnusable` (a kind of it) when the config that says where berthd listens
does not load, and :class:`ApiError` for a 4xx/5xx answer, with berthd's message (all three,
and :func:`unreachable`, live in :mod:`berth.client_sync`, whose one-call client the short
commands use without aiohttp; issue 38).

:class:`JobReporter` is what every front tells berthd about its engine's jobs (``berth run``'s
front and ComfyUI's gate alike; issue 12 case 4, issue 16).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
from berth import paths
from berth.client_sync import (
                               START_BERTHD,
                               ApiError,
                               BerthdUnavailable,
                               ConfigUnusable,
                               unreachable,
)
from berth.config.errors import ConfigError

__all__ = ["Client", "ApiError", "BerthdUnavailable", "ConfigUnusable", "JobReporter",
           "unreachable", "START_BERTHD"]

log = logging.getLogger("berth.client")


class Client:
    """``async with Client() as c: await c.status()``. ``socket`` defaults to berthd's, as
    berthd finds it (:func:`berth.paths.client_socket`: ``$BERTH_SOCKET``, else the config's
    ``[api] socket``, else ``<state dir>/berthd.sock``); ``url``+``key`` reach a TCP listener.
    Without ``socket``, a config that does not load makes every call raise
    :class:`ConfigUnusable` naming it (``socket`` is then ``None``, ``config_error`` the
    :class:`berth.config.ConfigError`)."""

    def __init__(self, socket: str | os.PathLike | None = None, url: str | None = None,
                 key: str | None = None, timeout_s: float = 30.0):
        self.config_error: ConfigError | None = None
        try:
            self.socket = Path(socket) if socket else paths.client_socket()
        except ConfigError as e:
            self.socket, self.config_error = None, e
        self.url = url or "http://berthd"
        self.key = key
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Client":
        conn = None
        if self.url == "http://berthd":
            if self.config_error is not None:
                raise ConfigUnusable(self.config_error)
            try:
                paths.check_socket(self.socket)     # never talk to another user's socket
            except paths.UnsafePath as e:
                raise BerthdUnavailable(f"refusing berthd's socket: {e}") from None
            conn = aiohttp.UnixConnector(path=str(self.socket))
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self._session = aiohttp.ClientSession(connector=conn, headers=headers)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, body: dict | None = None,
                   timeout_s: float | None = None, **params: Any) -> dict:
        if self._session is None:
            await self.__aenter__()
        t = aiohttp.ClientTimeout(total=(timeout_s or self.timeout_s))
        try:
            async with self._session.request(method, self.url + path, json=body, timeout=t,
                                             params={k: str(v) for k, v in params.items()}) as r:
                try:
                    data = await r.json(content_type=None)
                except ValueError:
                    data = {"error": {"message": (await r.text())[:500]}}
                if r.status >= 400:
                    err = (data or {}).get("error", {}) if isinstance(data, dict) else {}
                    raise ApiError(r.status, err.get("message", str(data)), err.get("type", ""))
                return data
        except (aiohttp.ClientConnectionError, FileNotFoundError, ConnectionRefusedError) as e:
            where = self.socket if self.url == "http://berthd" else self.url
            raise BerthdUnavailable(unreachable(where, e)) from None

    # -- the calls ---------------------------------------------------------------------------
    async def status(self) -> dict:
        return await self.call("GET", "/v1/status")

    async def request_lease(self, body: dict) -> dict:
        return await self.call("POST", "/v1/leases", body)

    async def wait_grant(self, lease_id: str, timeout_s: float = 25.0) -> dict:
        return await self.call("GET", f"/v1/leases/{lease_id}/grant", timeout_s=timeout_s + 10,
                               timeout=timeout_s)

    async def attach(self, lease_id: str, pid: int, start_time: float | None = None,
                     host: str | None = None) -> dict:
        body: dict = {"pid": pid}
        if start_time is not None:
            body["start_time"] = start_time
        if host:
            body["host"] = host
        return await self.call("POST", f"/v1/leases/{lease_id}/attach", body)

    async def report(self, lease_id: str, op: str, ok: bool, detail: str = "") -> dict:
        return await self.call("POST", f"/v1/leases/{lease_id}/report",
                               {"op": op, "ok": ok, "detail": detail[:2000]})

    async def instructions(self, lease_id: str, after: int, timeout_s: float = 25.0) -> dict:
        return await self.call("GET", f"/v1/leases/{lease_id}/instructions",
                               timeout_s=timeout_s + 10, after=after, timeout=timeout_s)

    async def wake(self, lease_id: str, client: str | None = None,
                   client_age_s: float | None = None) -> dict:
        """Ask berthd to wake the parked lease for a held request of ``client`` (a key from
        :mod:`berth.front.clients`) that arrived ``client_age_s`` seconds ago (issue 34)."""
        body: dict = {}
        if client is not None:
            body["client"] = client
        if client_age_s is not None:
            body["client_age_s"] = round(max(0.0, client_age_s), 3)
        return await self.call("POST", f"/v1/leases/{lease_id}/wake", body)

    async def touch(self, lease_id: str) -> dict:
        return await self.call("POST", f"/v1/leases/{lease_id}/touch", {})

    async def ready(self, lease_id: str) -> dict:
        return await self.call("POST", f"/v1/leases/{lease_id}/ready", {})

    async def release(self, lease_id: str, wait_s: float = 0.0, reason: str = "released") -> dict:
        return await self.call("POST", f"/v1/leases/{lease_id}/release", {"reason": reason},
                               timeout_s=wait_s + 10, wait=wait_s)

    async def note(self, engine: str, text: str) -> dict:
        """``POST /v1/notes``: a host's word about an engine no lease carries (issue 37)."""
        return await self.call("POST", "/v1/notes", {"engine": engine, "text": text[:500]})

    async def operator(self, op: str, target: str) -> dict:
        return await self.call("POST", f"/v1/operator/{op}", {"target": target})

    async def timeline(self, after: int = 0, timeout_s: float = 0.0) -> dict:
        return await self.call("GET", "/v1/timeline", timeout_s=timeout_s + 10, after=after,
                               timeout=timeout_s)


class JobReporter:
    """Tells berthd (``POST /v1/leases/{id}/jobs``) what a front's engine has to do, so its
    ladder does not displace a holder with a job running (bounded by its ``max_job``; issue 12
    case 4), and lets an idle one yield at once (issue 16: turns protect work, not idleness; a
    holder that never reported counts as busy).

    ``work()``: ``(jobs, oldest_at)``, the requests the front forwards or holds now (held
    requests are this engine's work too) and when the oldest of them arrived
    (``time.monotonic`` seconds, ``None`` when unknown). ``lease_id()``: the lease's id now
    (``None`` while unleased). ``client()``: the :class:`Client` to report through.
    ``served()``: how many model requests the front has started during this lease, a count that
    only grows (``None``: the front does not count them; issue 24: a request that starts and
    ends between two polls is seen by this count alone). Every ``poll_s`` seconds it reports a
    change: at once between zero and non-zero, and when the served count moved while the last
    report said nothing was in flight (the answer came and went unseen); else at most once per
    ``every_s``; again in full for a new lease. A failed report (berthd away, no lease) is
    tried again at the next poll. The age (seconds at the report, not this process's clock) is
    what crosses to berthd, which turns it into its own clock's time of arrival.

    ``clients()``: ``(oldest, answered, answered_at)``, the client key of the oldest of those
    requests, and the client key of the front's last answer and when it ended (monotonic s;
    issue 34: berthd's forecast of whether an idle holder is asked again reads them; ``None``:
    the front does not say). ``held()``: ``(held, oldest_held_at)``, how many of those
    requests the front holds, not yet forwarded, and when the oldest of them arrived
    (monotonic s; issue 34, the fence: a holder that holds requests is parked fenced at once;
    reported at once when it starts or stops holding). :meth:`kick` makes the next poll come
    at once (the front calls it when its last request ends: the holder's idle spell is what a
    waiter waits on)."""

    def __init__(self, work: Callable[[], tuple[int, float | None]],
                 lease_id: Callable[[], str | None], client: Callable[[], "Client | None"], *,
                 served: Callable[[], int] | None = None,
                 clients: Callable[[], tuple[str | None, str | None, float | None]] | None = None,
                 held: Callable[[], tuple[int, float | None]] | None = None,
                 poll_s: float = 0.05, every_s: float = 1.0):
        self.work, self.lease_id, self.client = work, lease_id, client
        self.served, self.clients, self.held = served, clients, held
        self.poll_s, self.every_s = poll_s, every_s
        self.sent: tuple | None = None
        self._sent_at = float("-inf")
        self._lease: str | None = None
        self._kick: asyncio.Event | None = None

    def kick(self) -> None:
        """Poll now rather than at the next ``poll_s`` (safe to call from the loop's thread)."""
        if self._kick is not None:
            self._kick.set()

    async def run(self) -> None:
        self._kick = asyncio.Event()
        while True:
            await self.poll()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._kick.wait()
            self._kick.clear()

    async def poll(self) -> bool:
        """Report now if the work changed enough; True when a report was sent."""
        n, oldest = self.work()
        served = None if self.served is None else self.served()
        who = (None, None, None) if self.clients is None else self.clients()
        held = (None, None) if self.held is None else self.held()
        now = time.monotonic()
        lid = self.lease_id()
        if lid != self._lease:
            self.sent = None               # a new lease: berthd knows nothing of its jobs
        sent = self.sent
        edge = sent is None or (n == 0) != (sent[0] == 0) or (
            sent[0] == 0 and served != sent[2]) or who[1:] != sent[3][1:] or (
            not held[0]) != (not sent[4][0])
        if (n, oldest, served, who, held) == sent or not (
                edge or now - self._sent_at >= self.every_s):
            return False
        try:
            await self.send(lid, n, None if oldest is None else max(0.0, now - oldest), served,
                            who, now, held)
        except Exception as e:             # berthd away: it learns the count when back
            log.debug("could not report %s requests in flight: %s", n, e)
            return False
        self.sent, self._sent_at, self._lease = (n, oldest, served, who, held), now, lid
        return True

    async def send(self, lid: str | None, n: int, oldest_age_s: float | None = None,
                   served: int | None = None,
                   who: tuple[str | None, str | None, float | None] = (None, None, None),
                   now: float = 0.0,
                   held: tuple[int | None, float | None] = (None, None)) -> None:
        client = self.client()
        if not lid or client is None:
            raise RuntimeError("no lease")
        body: dict = {"in_flight": n}
        if oldest_age_s is not None:
            body["oldest_age_s"] = round(oldest_age_s, 3)
        if served is not None:
            body["served"] = served
        oldest_client, answered, answered_at = who
        if oldest_client is not None and n:
            body["client"] = oldest_client
        if answered is not None and answered_at is not None:
            body["answered_client"] = answered
            body["answered_age_s"] = round(max(0.0, now - answered_at), 3)
        if held[0] is not None:
            body["held"] = held[0]
            if held[0] and held[1] is not None:
                body["oldest_held_age_s"] = round(max(0.0, now - held[1]), 3)
        await client.call("POST", f"/v1/leases/{lid}/jobs", body)
