"""The protocol plugin against real stub engines (``--protocol --lend``) on a simulated card:
the card's bytes move with park, wake, lend and return; an engine's 200 is not proof."""

from __future__ import annotations

import asyncio

import pytest

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

from .conftest import PCI, GiB, MiB, ctx

CONTEXT = 256 * MiB   # the stub's default --residual, kept by a park


@pytest.fixture
def pm():
    return make_plugin_manager(load_entry_points=False)


def act(pm, hook, eng, **kw):
    return asyncio.run(run_action(pm, hook, ctx("protocol", engine_url=eng.url, **kw)))


def use(kit, pid):
    return kit.driver.read(PCI).processes.get(pid)


def test_park_wake_lend_return_round_trips_move_the_card_bytes(kit, pm):
    eng = kit.start("--protocol", "--lend", "--kv-pool", "2GiB", weights="4GiB")
    held = CONTEXT + 4 * GiB + 2 * GiB
    free0 = kit.driver.read(PCI).free_bytes
    assert use(kit, eng.pid) == held
    assert act(pm, "berth_quiet", eng) is True

    act(pm, "berth_park", eng)
    assert use(kit, eng.pid) == CONTEXT
    assert kit.driver.read(PCI).free_bytes - free0 == held - CONTEXT
    act(pm, "berth_wake", eng, room_confirmed=True)
    assert use(kit, eng.pid) == held

    act(pm, "berth_lend", eng, bytes={PCI: 1 * GiB})
    assert use(kit, eng.pid) == held - 1 * GiB
    assert kit.driver.read(PCI).free_bytes - free0 == 1 * GiB
    act(pm, "berth_return", eng, bytes={PCI: 1 * GiB}, room_confirmed=True)
    assert use(kit, eng.pid) == held


def test_refusals_quote_the_engine(kit, pm):
    eng = kit.start("--protocol", "--lend", "--kv-pool", "1GiB", weights="1GiB")
    with pytest.raises(MechanismError, match=r"answered 409: cannot lend 2.0GiB.*only "
                                             "1.0GiB of the KV cache are unused"):
        act(pm, "berth_lend", eng, bytes={PCI: 2 * GiB})
    with pytest.raises(MechanismError, match="lend needs ctx.bytes"):
        act(pm, "berth_lend", eng)
    plain = kit.start(weights="1GiB")   # no --protocol
    with pytest.raises(MechanismError, match="404.*does not speak the Berth protocol"):
        act(pm, "berth_park", plain)


def test_park_noop_engine_answers_200_but_the_card_still_holds_the_bytes(kit, pm):
    eng = kit.start("--protocol", "--park-noop", weights="2GiB")
    held = CONTEXT + 2 * GiB
    act(pm, "berth_park", eng)          # the plugin reports success: the engine said 200
    assert use(kit, eng.pid) == held    # the driver read the broker takes shows nothing freed


def test_wake_that_never_answers_fails_within_the_bound(kit, pm):
    eng = kit.start("--protocol", "--wake-hang", weights="1GiB")
    act(pm, "berth_park", eng)
    with pytest.raises(MechanismError, match="did not (answer|finish) within"):
        act(pm, "berth_wake", eng, room_confirmed=True, timeout_s=0.5)


def test_an_engine_that_is_not_there(pm):
    with pytest.raises(MechanismError, match="POST http://127.0.0.1:9/berth/v1/park failed"):
        asyncio.run(run_action(pm, "berth_park", ctx("protocol", engine_url="http://127.0.0.1:9")))
    with pytest.raises(MechanismError, match="no engine_url given"):
        asyncio.run(run_action(pm, "berth_park", ctx("protocol")))
