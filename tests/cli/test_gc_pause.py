"""The garbage collector's pause at a Berth process's start (:mod:`berth.startup`): on until a
kept command says it started, frozen start-up objects then, and nothing done to a process that
did not pause (a caller of :func:`berth.cli.main` in its own process)."""

from __future__ import annotations

import gc
import subprocess
import sys

from berth import startup


def test_a_process_that_did_not_pause_is_left_alone():
    frozen, on = gc.get_freeze_count(), gc.isenabled()
    startup.started()
    assert (gc.get_freeze_count(), gc.isenabled()) == (frozen, on)


def test_pause_then_started_freezes_the_start_and_collects_again():
    code = """if True:
        import gc
        from berth import startup
        startup.pause()
        assert not gc.isenabled()
        startup.started()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        startup.started()                       # once only
        assert gc.get_freeze_count() == frozen
    """
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_a_command_not_kept_runs_with_the_collector_on():
    code = """if True:
        import gc, sys
        from berth import cli
        def check(args):
            print("on" if gc.isenabled() else "off")
        cli._run = lambda parser, args: check(args)
        sys.argv = ["berth", "sim", "cards"]
        cli.main()
        sys.argv = ["berth", "status"]          # kept paused: one call, then it exits
        cli.main()
    """
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["on", "off"]
