"""An engine that escapes (issue 36): one that double-forks and calls ``setsid()`` left
``berth run``'s reach, and its memory became nobody's lease (a stowaway). ``berth run`` is a
child subreaper: the daemonized server is re-parented to the run, its memory counts for the
lease, and the run stops it with the engine."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil

from tests.berthd import BERTH
from tests.helpers import wait_for
from tests.run.world import GiB, run_cmd

DOUBLE_FORK = str(Path(__file__).with_name("double_fork.py"))


def test_a_double_forked_setsid_engine_counts_for_its_lease(world):
    d = world.start_berthd()
    argv = [sys.executable, DOUBLE_FORK, BERTH, "sim", "engine", "--port", "{port}",
            "--weights", "13GiB", "--load-s", "0.2", "--model", "A"]
    a = world.model("A", run_cmd("A", park=False, engine_argv=argv))
    a.start()
    lease = d.lease_of("A")
    launcher = lease["pid"]
    run = psutil.Process(a.pid)
    # The server: the process holding memory on the card, not the launcher.
    server = wait_for(lambda: next((pid for pid in world.sim().cards[0].processes
                                    if pid != launcher), None), 30, "the daemonized server")
    assert psutil.Process(server).ppid() == run.pid, "the run took the daemon in"
    assert psutil.Process(server).pid not in {c.pid for c in
                                              psutil.Process(launcher).children(recursive=True)}

    def counted():
        le = d.lease_of("A")
        card = d.status()["cards"][0]
        used = le["shares"][0]["used_bytes"] or 0
        return (used, card["stowaway_bytes"]) if used >= 13 * GiB else None
    used, stowaways = wait_for(counted, 30, "the daemon's memory counted for A")
    assert stowaways == 0, d.status()["cards"][0]
    assert "escapees" not in d.lease_of("A")
    # A restarted berthd reads from its state file that the run is a subreaper: the daemon's
    # memory is still A's, not a stowaway's.
    before = d.lease_of("A")["id"]
    d.kill9()
    d.start()
    assert d.lease_of("A")["id"] == before
    used, stowaways = wait_for(counted, 30, "the daemon's memory counted for A after a restart")
    assert stowaways == 0, d.status()["cards"][0]
    st = a.stop()
    assert st.exit_code in (0, -15, 143) and not st.killed, st
    wait_for(lambda: not psutil.pid_exists(server) or
             psutil.Process(server).status() == psutil.STATUS_ZOMBIE, 30,
             "the daemon stopped with the run")


def test_memory_of_a_process_that_left_the_tree_is_named_the_leases_escapee():
    """A process once in a lease's tree that holds memory outside it now (the run killed, its
    subreaper gone) still counts for the lease, and status names it as the lease's escapee."""
    from berth.daemon.reads import Reads
    from berth.driver.base import Reading
    reads = Reads(driver=None, ledger=None)
    pci = "0000:01:00.0"
    both = Reading(pci, 0.0, 10 * GiB, 24 * GiB, {100: 1 * GiB, 200: 7 * GiB})
    first = reads._map(pci, both, [], {"L1": {100, 200}})
    assert first.stowaway_bytes == 0 and reads.escapees == {}
    then = reads._map(pci, both, [], {"L1": {100}})          # 200 left the tree
    assert then.stowaway_bytes == 0, then
    assert reads.escapees == {"L1": {pci: {200: 7 * GiB}}}
    reads._map(pci, Reading(pci, 1.0, 17 * GiB, 24 * GiB, {100: 1 * GiB}), [], {"L1": {100}})
    assert reads.escapees == {"L1": {}}
