"""Fixtures for tests against the real programs (``../shared/tools``; mark them ``real``).

``real_tools`` finds the programs (:class:`bench.realswap.Tools`: ``$BERTH_REAL_TOOLS``, else
``<repo>/../shared/tools``). When they are absent the test skips with a reason naming that
folder, and fails instead when ``BERTH_REQUIRE_REAL=1`` (``.ci/run`` sets it: there, a
``real`` test that cannot run is a failure, never a quiet skip).

``real_swap`` makes a :class:`bench.realswap.Swap` (a real llama-swap with real
``llama-server`` models, under Berth or alone) in the test's directory and closes every swap it
made at teardown, checking that no process was left behind. A test starts it itself, so it can
change the models, card and policy first::

    def test_x(real_swap):
        swap = real_swap([Model("a"), Model("b", gguf="tiny-b.gguf")]).start()
        assert swap.chat("a").status == 200
"""

from __future__ import annotations

import os

import pytest

from bench.realswap import Model, Swap, Tools, tools_dir

__all__ = ["real_tools", "real_swap", "REQUIRE_ENV", "Model"]

REQUIRE_ENV = "BERTH_REQUIRE_REAL"


@pytest.fixture(scope="session")
def real_tools() -> Tools:
    tools = Tools.find()
    missing = tools.missing()
    if missing:
        why = (f"needs the real llama-swap, llama-server and tiny GGUFs in {tools_dir()} "
               f"(../shared/tools beside the checkout, or $BERTH_REAL_TOOLS); missing: "
               f"{', '.join(missing)}")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1: {why}")
        pytest.skip(why)
    return tools


@pytest.fixture
def real_swap(real_tools, tmp_path):
    made: list[Swap] = []

    def make(models: list[Model], **kw) -> Swap:
        swap = Swap(tmp_path / f"swap{len(made)}", real_tools, models, **kw)
        made.append(swap)
        return swap

    yield make
    left = []
    for swap in made:
        swap.close()
        left += [f"{p.pid} {p.name()}" for p in swap.processes()]
    assert not left, f"processes left behind: {left}"
