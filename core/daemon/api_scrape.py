"""``GET /metrics`` with prometheus_client loaded at the first scrape, not at berthd's start.

Source: issue 4 "The control API" (``GET /metrics``); issue 38: berthd starts hundreds of times
in the test suite, and most berthds are never scraped. The figures are collectors that read the
board at scrape time (:mod:`berth.daemon.api_metrics`), so a registry built at the first scrape
gives what one built at the start would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from berth.daemon.broker import Broker
    from prometheus_client import CollectorRegistry

__all__ = ["SCRAPE", "Scrape", "metrics"]


class Scrape:
    """What ``/metrics`` reads: ``broker``'s board and ``waits`` (the board's
    :class:`~berth.daemon.board_web.WaitTimes`, or ``None``); :meth:`registry` builds the
    registry once, at the first call."""

    def __init__(self, broker: "Broker", waits=None):
        self.broker, self.waits = broker, waits
        self._registry: CollectorRegistry | None = None

    def registry(self) -> "CollectorRegistry":
        if self._registry is None:
            from berth.daemon.api_metrics import registry
            self._registry = registry(self.broker, self.waits)
        return self._registry


SCRAPE = web.AppKey("scrape", Scrape)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text (version 0.0.4)."""
    from prometheus_client import generate_latest
    body = generate_latest(request.app[SCRAPE].registry())
    return web.Response(body=body, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus": "0.0.4"})
