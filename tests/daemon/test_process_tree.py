"""A lease's process tree as berthd walks it at every read (:func:`berth.process.tree_pids`,
issue 38): down from the root through each thread's ``children`` file, the same set as psutil's
walk over every process's parent, a child started from a second thread included."""

from __future__ import annotations

import subprocess
import sys

import psutil
from berth import process
from berth.process import tree_pids

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
