"""A lease's process tree as berthd walks it (:func:`berth.process.tree_pids`, issue 38): down
from the root through each thread's ``children`` file, the same set as psutil's walk over every
process's parent, a child started from a second thread included; and the reader's cheaper
questions at every read (:class:`~berth.process.Ancestry`, up from the processes on the cards;
:class:`~berth.process.Liveness`, a pidfd's poll), which must answer as the walk and
:func:`~berth.process.alive` do."""

from __future__ import annotations

import subprocess
import sys

import psutil
from berth import process
from berth.process import Ancestry, Liveness, alive, identify, tree_pids

from tests.helpers import stop_group, wait_for

#: A process that starts a child from its main thread and one from a second thread (listed in
#: that thread's own ``children`` file); the first child starts a grandchild, then all sleep.
TREE = r"""
import subprocess, sys, threading, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
parent = [sys.executable, "-c",
          "import subprocess, sys, time; subprocess.Popen(%r); time.sleep(120)" % (sleep,)]
subprocess.Popen(parent)
t = threading.Thread(target=lambda: (subprocess.Popen(sleep), time.sleep(120)))
t.start()
time.sleep(120)
"""


def _psutil_tree(root: int) -> set[int]:
    return {root} | {c.pid for c in psutil.Process(root).children(recursive=True)}


def test_the_tree_from_children_files_is_psutils_tree_with_a_thread_s_child():
    assert process._CHILDREN_FILES      # Linux with CONFIG_PROC_CHILDREN: the walk under test
    root = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        wait_for(lambda: len(_psutil_tree(root.pid)) == 4, 30, "the root, two children and a "
                 "grandchild")
        assert tree_pids(root.pid) == _psutil_tree(root.pid)
    finally:
        stop_group(root)
    assert tree_pids(root.pid) == set()     # gone (reaped): no tree


def test_the_ancestry_asked_up_from_each_process_is_the_tree_walked_down():
    root = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        wait_for(lambda: len(_psutil_tree(root.pid)) == 4, 30, "the root, two children and a "
                 "grandchild")
        tree = tree_pids(root.pid)
        everyone = set(psutil.pids())
        anc = Ancestry()
        # Each process of the tree as a root, and roots outside it: this test, init, a PID
        # that is no process.
        for r in [*sorted(tree), root.pid, 2**22 + 7]:
            assert anc.within(everyone, r) == tree_pids(r) & everyone, r
        # Above the tree, the machine's other processes come and go between two walks (the
        # suite runs beside this test: one that exited between them failed it): judged on the
        # tree, which each holds whole.
        for r in (psutil.Process().pid, 1):
            assert anc.within(everyone, r) & tree == tree_pids(r) & tree == tree, r
    finally:
        stop_group(root)
    assert Ancestry().within(tree, root.pid) == set()      # gone (reaped): nothing below it


def test_liveness_answers_as_alive_while_a_process_lives_turns_zombie_and_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ids = [identify(child.pid), identify(psutil.Process().pid)]
    other = process.ProcessId(ids[0].pid, ids[0].start_time + 5)   # the PID, another start
    live = Liveness()
    try:
        for _ in range(2):          # the first ask checks /proc, the second polls the pidfd
            assert [live.alive(i) for i in [*ids, other]] == [True, True, False]
        child.kill()
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 30,
                 "the child a zombie")
        assert live.alive(ids[0]) is False and alive(ids[0]) is False
        child.wait()
        assert live.alive(ids[0]) is False and live.alive(ids[1]) is True
        live.sweep()
        live.alive(ids[1])
        live.sweep()                # not asked since the sweep before: forgotten, fd closed
        assert list(live._fds) == [ids[1]] and not live._dead
    finally:
        child.kill()
        child.wait()
        live.close()
    assert not live._fds
