"""A park asked twice (berthd restarted inside a checkpoint settles the share parking and asks
the park again, issue 18) is answered ok both times: the checkpoint hook reads each PID's state
first and leaves a checkpointed process as it is, where a second ``--action lock`` would fail
(cuda-checkpoint: illegal state) and berthd would answer the failed park with a drain."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from berth.decide.instruction import Instruction
from berth.decide.model import Op
from berth.process import identify
from berth.run.actions import Actions
from berth.run.cli import RunOptions

from berth_plugins.manager import make_plugin_manager
from tests.run.test_return_twice import _Lease
from tests.run.world import CHECKPOINT
from tests.sim.conftest import PCI, GiB, kit  # noqa: F401  (the fixture)


def test_a_second_park_of_a_checkpointed_engine_is_parked_already(kit):  # noqa: F811
    eng = kit.start(weights="4GiB")
    opts = RunOptions(cmd=[], engine="e", park="checkpoint", checkpoint_path=CHECKPOINT)
    lease = _Lease()
    lease.use, lease.ram_available = {PCI: 4 * GiB}, 64 * GiB
    engine = SimpleNamespace(ident=identify(eng.pid), url=eng.url)
    acts = Actions(opts, make_plugin_manager(load_entry_points=False), lease, engine, None,
                   asyncio.Event())

    async def go():
        for seq in (1, 2):
            await acts.carry_out(Instruction(Op.PARK, (PCI,), seq))
    asyncio.run(go())
    assert kit.state(eng.pid) == "checkpointed"
    assert [(op, ok) for op, ok, _ in lease.reports] == [("park", True), ("park", True)], \
        lease.reports
