"""Programs that supervisord autostarts together (Supervisor #122: every autostart program at
once), against a real supervisord (issue 37 "supervisord starts every program at once").

- Under ``berth run`` (the README's wrap): five programs of 6 GiB on a card that fits three are
  admitted in turn: three run, two wait with their reason on the board, and no load runs out of
  memory.
- Observed programs that load at once: the one that dies for lack of memory is named with its
  reason in the listener's log and in ``berth status``."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for

from .conftest import PY, Prog, engine_cmd, free_port

BERTH = f"{PY} -m berth.cli"


def _run_cmd(engine: str) -> str:
    return (f"{BERTH} run --engine {engine} --size 6GiB -- {BERTH} sim engine --port {{port}} "
            f"--weights 5GiB --load-s 0.3")


@pytest.mark.early(55)
def test_five_autostarting_berth_runs_on_a_card_that_fits_three(stack_factory):
    names = [f"p{i}" for i in range(1, 6)]
    s = stack_factory([Prog(n, _run_cmd(n), startsecs=1) for n in names])
    wait_for(lambda: len([n for n in names if s.active(n)]) == 3
             and len(s.status()["waiting"]) == 2, 60, "three leases active, two waiting")
    st = s.status()
    waiting = {w["engine"]: w for w in st["waiting"]}
    assert len(waiting) == 2, st["waiting"]
    # The first in the queue waits for the holders; the one behind it may name it instead (on a
    # loaded machine: "queued behind p5 for the same card", issue 38).
    for e, w in waiting.items():
        ahead = [o for o in waiting if o != e]
        assert w["why"] and ("holds" in w["why"] or "short" in w["why"] or any(
            f"queued behind {o}" in w["why"] for o in ahead)), w
    assert any("holds" in w["why"] or "short" in w["why"] for w in waiting.values()), waiting
    # supervisord runs all five (the two waiting are berth runs holding their start), and no
    # load ran out of memory on the card.
    wait_for(lambda: all(s.info(n).statename == "RUNNING" for n in names), 30,
             "all five RUNNING in supervisord")
    assert s.oom_events() == 0
    board = s.berth("status").stdout
    for engine in waiting:
        assert engine in board.split("waiting:")[1], board
    assert "waiting:" in board and "needs gpu0 6.0GiB" in board, board
    # One of the three stops: the first waiter is admitted, no one else.
    running = [n for n in names if s.active(n)]
    s.ctl("stop", running[0])
    wait_for(lambda: len([n for n in names if s.active(n)]) == 3, 60,
             "a waiter admitted once room frees")
    assert len(s.status()["waiting"]) == 1
    assert s.oom_events() == 0


@pytest.mark.expect_oom
def test_an_observed_program_that_dies_for_lack_of_memory_is_named(stack_factory):
    progs = [Prog(n, engine_cmd(free_port(), "14GiB"), engine=n, size="15GiB")
             for n in ("big-a", "big-b")]
    s = stack_factory(progs)
    # Both load at once: one fits, the other's load runs out of memory and it exits.
    wait_for(lambda: any(s.info(n).statename in ("EXITED", "FATAL") for n in ("big-a", "big-b")),
             60, "one of them dead")
    dead = next(n for n in ("big-a", "big-b") if s.info(n).statename in ("EXITED", "FATAL"))
    wait_for(lambda: f"{dead}: supervisord program {dead} died for lack of memory"
             in s.log("listener.log"), 30, "the listener naming it")
    # berthd may answer after the death (it starts with the programs): told at the next tick.
    wait_for(lambda: f"! {dead} (" in s.berth("status").stdout, 30, "berth status naming it")
    board = s.berth("status").stdout
    line = next(x for x in board.splitlines() if x.startswith(f"! {dead} ("))
    assert "died for lack of memory" in line and "OutOfMemoryError" in line, board
    assert s.oom_events() >= 1
