"""A drained run tells berthd that it waits: ``berth status`` lists it as drained, with its waiters.

Source: issue 35. After a drain the run keeps its front but holds no lease, so berthd's ledger no
longer knows it; :class:`DrainedNote` puts an entry at ``PUT /v1/drained/{engine}``
(:mod:`berth.daemon.api_drained`) with the requests the front holds, sends it again when that
number changes and every :data:`REFRESH_S` (a restarted berthd learns it again), and removes it
once the engine serves again or the run ends. berthd being down changes nothing for the run. The
note is for the board, and for the gateway, which sends the engine's requests (by its name and
aliases) to the front it names.

It also listens for an operator's ``berth wake ENGINE``: a long-poll of ``GET
/v1/drained/{engine}/wake`` (:data:`LISTEN_S` at a time), which berthd answers the moment the
wake is asked; the note then calls ``on_wake`` and the run asks for its card again as a write
would make it. The latency from ``berth wake`` to the run asking is one local round trip (a few
milliseconds); the engine then starts once granted, as after a write (its grant, its start and
its health check): with the card free, about 1 s from ``berth wake`` to a stub engine serving
through its front (tests/run/test_drained_wake.py, the CLI's own start included). With berthd
down or restarted, the poll is made again within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from urllib.parse import quote

from berth.client import ApiError, BerthdUnavailable, Client
from berth.front import Front

__all__ = ["LISTEN_S", "DrainedNote", "REFRESH_S"]

log = logging.getLogger("berth.run")

#: The longest between two puts of the same entry (seconds).
REFRESH_S = 10.0
#: How often the front's count of held requests is looked at (seconds; a local read).
_LOOK_S = 0.25
#: The longest one long-poll for ``berth wake`` waits at berthd (seconds).
LISTEN_S = 25.0


class DrainedNote:
    """berthd's entry for one drained run: :meth:`start` it after the drain, :meth:`asking`
    once a write made the run ask for a new grant, :meth:`close` once the engine serves.
    ``on_wake``: called when an operator's ``berth wake`` asks the run to start again (while
    it is not asking already); True when the run asks for its card again."""

    def __init__(self, engine: str, front: Front | None, why: str, move_to: str | None = None,
                 move_from: list[str] | None = None, aliases: list[str] | None = None,
                 on_wake: Callable[[], bool] | None = None):
        self.engine, self.front, self.why, self.move_to = engine, front, why, move_to
        self.move_from = list(move_from or [])
        self.aliases = list(aliases or [])      # the gateway routes them to the front too
        self.client = Client()
        self.is_asking = False
        self.on_wake = on_wake
        self._task: asyncio.Task | None = None
        self._listen: asyncio.Task | None = None
        self._path = f"/v1/drained/{quote(engine, safe='')}"
        self.since = time.time()         # when the drain happened, for a restarted berthd

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        if self.on_wake is not None:
            self._listen = loop.create_task(self._listen_for_wake())

    def asking(self, asking: bool = True) -> None:
        """The run asked for a new grant: its lease now waits in berthd's queue too
        (``False``: the request was withdrawn, nobody waiting for it any more)."""
        self.is_asking = asking

    async def _run(self) -> None:
        sent: tuple | None = None
        since = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = (self.front.holding if self.front is not None else 0, self.is_asking)
            if now != sent or loop.time() - since >= REFRESH_S:
                if await self._put(*now):
                    sent, since = now, loop.time()
            await asyncio.sleep(_LOOK_S)

    async def _listen_for_wake(self) -> None:
        """Long-poll berthd for an operator's ``berth wake``; call ``on_wake`` when it comes
        and the run is not asking already (then wait until it is drained again)."""
        path = f"{self._path}/wake"
        while True:
            if self.is_asking:
                await asyncio.sleep(_LOOK_S)
                continue
            try:
                r = await self.client.call("GET", path, timeout_s=LISTEN_S + 10,
                                           timeout=LISTEN_S)
            except BerthdUnavailable:
                await asyncio.sleep(1.0)
                continue
            except ApiError as e:           # a berthd without the route: look again later
                log.debug("the wake poll for %s: %s", self.engine, e)
                await asyncio.sleep(REFRESH_S)
                continue
            if r.get("wake") and not self.is_asking:
                log.info("%s: berth wake asks its run to start it again", self.engine)
                self.is_asking = True       # said to berthd at the next put (within _LOOK_S)
                if not self.on_wake():
                    self.is_asking = False
                    await asyncio.sleep(1.0)

    async def _put(self, holding: int, asking: bool) -> bool:
        front = f"{self.front.host}:{self.front.port}" if self.front is not None else None
        body = {"front": front, "holding": holding,
                "why": self.why, "owner_pid": os.getpid(), "asking": asking,
                "move_to": self.move_to, "move_from": self.move_from, "aliases": self.aliases,
                "since": self.since}
        try:
            await self.client.call("PUT", self._path, body)
            return True
        except BerthdUnavailable:
            return False
        except ApiError as e:
            log.warning("berthd refused the note that %s is drained: %s", self.engine, e)
            return True                  # said once; asked again at the next refresh

    async def close(self) -> None:
        """Stop refreshing and remove the entry (best effort: berthd may be down)."""
        if self._listen is not None:
            self._listen.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listen
            self._listen = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.call("DELETE", self._path)
        await self.client.close()
