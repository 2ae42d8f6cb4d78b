"""A drained run tells berthd that it waits: ``berth status`` lists it as drained, with its waiters.

Source: issue 35. After a drain the run keeps its front but holds no lease, so berthd's ledger no
longer knows it; :class:`DrainedNote` puts an entry at ``PUT /v1/drained/{engine}``
(:mod:`berth.daemon.api_drained`) with the requests the front holds, sends it again when that
number changes and every :data:`REFRESH_S` (a restarted berthd learns it again), and removes it
once the engine serves again or the run ends. berthd being down changes nothing for the run. The
note is for the board, and for the gateway, which sends the engine's requests (by its name and
aliases) to the front it names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from urllib.parse import quote

from berth.client import ApiError, BerthdUnavailable, Client
from berth.front import Front

__all__ = ["DrainedNote", "REFRESH_S"]

log = logging.getLogger("berth.run")

#: The longest between two puts of the same entry (seconds).
REFRESH_S = 10.0
#: How often the front's count of held requests is looked at (seconds; a local read).
_LOOK_S = 0.25


class DrainedNote:
    """berthd's entry for one drained run: :meth:`start` it after the drain, :meth:`asking`
    once a write made the run ask for a new grant, :meth:`close` once the engine serves."""

    def __init__(self, engine: str, front: Front | None, why: str, move_to: str | None = None,
                 move_from: list[str] | None = None, aliases: list[str] | None = None):
        self.engine, self.front, self.why, self.move_to = engine, front, why, move_to
        self.move_from = list(move_from or [])
        self.aliases = list(aliases or [])      # the gateway routes them to the front too
        self.client = Client()
        self.is_asking = False
        self._task: asyncio.Task | None = None
        self._path = f"/v1/drained/{quote(engine, safe='')}"
        self.since = time.time()         # when the drain happened, for a restarted berthd

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.call("DELETE", self._path)
        await self.client.close()
