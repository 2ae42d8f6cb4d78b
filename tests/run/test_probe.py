"""``berth run``'s health probe keeps the cadence of :mod:`berth.run.probe`, the module the policy
simulator charges a Berth cold start from (issue 34): the two cannot disagree."""

from __future__ import annotations

import asyncio
import itertools
import time

from aiohttp import ClientSession, web
from berth.run import probe
from berth.run.cli import RunOptions
from berth.run.engine import EngineProcess


def test_the_cadence_is_short_and_capped():
    got = list(itertools.islice(probe.delays(), 5))
    assert got[0] == probe.FIRST_S and max(got) == probe.CAP_S <= 0.1
    assert probe.seen_at(0.0) == 0.0
    # A cold start that answers from 14 s on is seen at the next GET, at most CAP_S later.
    assert 14.0 <= probe.seen_at(14.0) <= 14.0 + probe.CAP_S


def test_until_healthy_sleeps_the_probes_delays(monkeypatch):
    """An engine that answers 503 three times, then 200: the run's probe GETs four times and
    sleeps exactly the first three delays :func:`berth.run.probe.delays` gives."""
    taken: list[float] = []
    real = probe.delays

    def recorded():
        for d in real():
            taken.append(d)
            yield d
    monkeypatch.setattr(probe, "delays", recorded)
    gets: list[float] = []

    async def health(_request):
        gets.append(time.monotonic())
        return web.Response(status=200 if len(gets) > 3 else 503)

    async def go():
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        engine = EngineProcess(RunOptions(cmd=["true"], engine="e", sizes=[(None, "1GiB")]))
        engine.url = f"http://127.0.0.1:{port}"
        try:
            async with ClientSession() as engine.http:
                return await engine.until_healthy(30.0)
        finally:
            await runner.cleanup()
    assert asyncio.run(go()) is True
    assert len(gets) == 4 and taken == list(itertools.islice(real(), 3))
    # The sleeps are at least those delays (a lower bound holds on a loaded machine).
    assert gets[-1] - gets[0] >= sum(taken) - 1e-3
