"""The front's callbacks of a run's lease: what clients ask for, told to berthd (issue 5,
issue 34): a held write asks for the wake, the last held request gone withdraws it, a forwarded
request touches the lease.

:class:`FrontCallbacks` is a mixin of :class:`~berth.run.lease.LeaseClient`; it reads the
lease's ``client``, ``front``, ``lease_id`` and ``waits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from berth.client import ApiError, BerthdUnavailable, Client
from berth.front import Front

if TYPE_CHECKING:
    from berth.run.waits import WaitWords

__all__ = ["FrontCallbacks", "held_asker"]

log = logging.getLogger("berth.run")


class FrontCallbacks:
    """The callbacks a run's front calls (:meth:`on_wake`, :meth:`on_unwanted`,
    :meth:`on_activity`)."""

    client: Client
    front: Front | None
    lease_id: str | None
    waits: "WaitWords"
    _touching: bool

    async def on_wake(self) -> None:
        """The front holds a write for the sleeping engine: ask berthd to resume the lease.
        Raises ``RuntimeError`` (the front answers the held writes 503) without berthd."""
        if not self.lease_id:
            raise RuntimeError("berthd is unavailable, so the engine cannot be woken safely")
        try:
            # Whose request asks, and since when (issue 34: a holder that answered it yields).
            r = await self.client.wake(self.lease_id, *held_asker(self.front))
            self.waits.update(r.get("wait"))
        except BerthdUnavailable as e:
            raise RuntimeError(f"berthd is unavailable ({e}); the engine stays parked") from None

    def on_unwanted(self) -> None:
        """The last request held for a wake gave up: withdraw the wake, unless it is under way,
        so it does not later displace an engine in use for nobody."""
        if not self.lease_id or self.front is None:
            return

        async def withdraw():
            try:
                r = await self.client.call("DELETE", f"/v1/leases/{self.lease_id}/wake")
            except (BerthdUnavailable, ApiError):
                return
            if r.get("withdrawn") and self.front is not None and self.front.holding == 0:
                with contextlib.suppress(Exception):
                    self.front.sleep()
                log.info("the requests that asked for the wake have gone; it stays parked")
            elif r.get("withdrawn") and self.front is not None:   # a write came meanwhile
                await _wake_again(self)
        asyncio.get_running_loop().create_task(withdraw())

    def on_activity(self) -> None:
        """The front forwarded a request: touch the lease (one call in flight at most)."""
        if not self.lease_id or self._touching:
            return
        self._touching = True

        async def touch():
            try:
                with contextlib.suppress(BerthdUnavailable, ApiError):
                    await self.client.touch(self.lease_id)
            finally:
                self._touching = False
        asyncio.get_running_loop().create_task(touch())


async def _wake_again(lease: FrontCallbacks) -> None:
    """A write arrived while its wake was being withdrawn: it asks for the wake again."""
    try:
        await lease.on_wake()
    except Exception as e:
        lease.front.fail_held(f"wake failed: {e}")


def held_asker(front: "Front | None") -> tuple[str | None, float | None]:
    """The client key of the oldest request ``front`` holds, and its age in seconds."""
    at = front.oldest_at if front is not None else None
    return (front.oldest_client if at is not None else None,
            None if at is None else time.monotonic() - at)
