"""Fixtures for the plugin tests: the simulation kit of ``tests/sim`` (a simulated 24 GiB card,
real stub engines, the stand-in cuda-checkpoint), small aiohttp servers on 127.0.0.1, and
third-party plugin distributions built in ``tmp_path`` and found through their entry points."""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp import web

from berth_plugins.hookspecs import ActionContext

from ..sim.conftest import PCI, GiB, MiB, kit  # noqa: F401  (re-exported; kit is a fixture)


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port for the duration; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def ctx(mechanism: str, **kw) -> ActionContext:
    """An :class:`ActionContext` for engine ``"e"`` with a short bound unless given."""
    kw.setdefault("timeout_s", 60.0)      # bounds a failure: the tool calls are processes
    return ActionContext(engine="e", mechanism=mechanism, **kw)


class Dists:
    """Builds installed-looking distributions under one directory put on ``sys.path``."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: list[str] = []

    def add(self, dist: str, entry_points: dict[str, str], modules: dict[str, str],
            group: str = "berth") -> None:
        """A distribution ``dist`` with modules (name -> source) and entry points of ``group``
        (``berth``, or ``berth.adapters`` for an adapter)."""
        for name, source in modules.items():
            (self.root / f"{name}.py").write_text(textwrap.dedent(source))
            self.modules.append(name)
        info = self.root / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{eps}")
        importlib.invalidate_caches()


@pytest.fixture
def dists(tmp_path, monkeypatch):
    """Third-party distributions found by ``importlib.metadata`` through ``sys.path``; the path
    entry and the imported modules are removed afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    d = Dists(root)
    yield d
    for name in d.modules:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
