"""A drain's confirmation watches the lease's own process even when no read saw it yet.

Found by the real llama.cpp tests (issue 30): an engine drained right after its start, before
berthd's reader saw its memory, was confirmed freed at once (the confirmation watched an empty
set of PIDs, and an empty set is always gone), so its memory, still on the card until the
driver freed it, showed up as a stowaway and the waiter was refused "no room". Rule 1: memory
counts as free only after a driver read shows it free.
"""

from __future__ import annotations

import subprocess
import time

import psutil
from berth.daemon.reads import Reads
from berth.decide.effects import Until, Watch
from berth.decide.ledger import Ledger
from berth.decide.model import Card, Lease, Share
from berth.driver.base import PidsGone, _shows
from berth.sim.cards import CardSpec, SimCards
from berth.sim.driver import SimDriver

from tests.helpers import wait_for

GiB = 1 << 30


def test_the_lease_pid_is_watched_until_the_driver_drops_it(tmp_path):
    spec = CardSpec.make("gpu0", 4 * GiB)
    store = SimCards.init(tmp_path / "sim", [spec], free_delay_s=0.3)
    engine = subprocess.Popen(["sleep", "60"])
    try:
        store.alloc(spec.pci, 3 * GiB, pid=engine.pid)   # after any read berthd took
        ledger = Ledger()
        ledger.add_card(Card(spec.pci, "gpu0", 4 * GiB))
        lease = Lease("a-1", "a", {spec.pci: Share(spec.pci, 3 * GiB)}, pid=engine.pid,
                      start_time=psutil.Process(engine.pid).create_time())
        reads = Reads(SimDriver(tmp_path / "sim"), ledger)
        pids, event = reads.confirmation(lease, Watch("a-1", spec.pci, Until.FREED, 0, 0.0, 1.0))
        assert engine.pid in pids and isinstance(event, PidsGone)
        driver = SimDriver(tmp_path / "sim")
        assert not _shows(event, driver.read(spec.pci))          # alive: not freed
        engine.kill()
        engine.wait(10)
        gone_at = time.monotonic()
        assert not _shows(event, driver.read(spec.pci))          # dead, not yet freed
        wait_for(lambda: _shows(event, driver.read(spec.pci)), 10, "the driver to free it")
        assert time.monotonic() - gone_at >= 0.3
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait(10)
