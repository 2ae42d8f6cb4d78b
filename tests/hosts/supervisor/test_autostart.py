"""Programs that supervisord autostarts together (Supervisor #122: every autostart program at
once), against a real supervisord (issue 37 "supervisord starts every program at once").

- Under ``berth run`` (the README's wrap): five programs of 6 GiB on a card that fits three are
  admitted in turn: three run, two wait with their reason on the board, and no load runs out of
  memory.
- The same five while berthd is slow to answer (held at its interpreter's start, as a loaded
  machine holds it for seconds): no run fails open while berthd starts beside it; each waits for
  berthd, and berthd admits them in turn.
- Observed programs that load at once: the one that dies for lack of memory is named with its
  reason in the listener's log and in ``berth status``."""

from __future__ import annotations

import errno
import os
import re

import pytest

from tests.helpers import wait_for

from .conftest import PY, REPO, Prog, engine_cmd, free_port

BERTH = f"{PY} -m berth.cli"


def _run_cmd(engine: str, size: str = "6GiB", weights: str = "5GiB") -> str:
    return (f"{BERTH} run --engine {engine} --size {size} -- {BERTH} sim engine --port {{port}} "
            f"--weights {weights} --load-s 0.3")


def _reasons_named(waiting: list[dict]) -> None:
    """Each waiter's reason names what holds it: the card short and the leases that hold it,
    or the waiter ahead of it for the same card (runs that ask together queue in turn)."""
    names = {w["engine"] for w in waiting}
    for w in waiting:
        why = w["why"] or ""
        m = re.match(r"queued behind (\S+) for the same card", why)
        assert "holds" in why or "short" in why or (m is not None and m[1] in names - {
            w["engine"]}), waiting


@pytest.mark.early(15)
def test_five_autostarting_berth_runs_on_a_card_that_fits_three(stack_factory):
    names = [f"p{i}" for i in range(1, 6)]
    s = stack_factory([Prog(n, _run_cmd(n), startsecs=1) for n in names])
    wait_for(lambda: len([n for n in names if s.active(n)]) == 3
             and len(s.status()["waiting"]) == 2, 60, "three leases active, two waiting")
    st = s.status()
    waiting = {w["engine"]: w for w in st["waiting"]}
    assert len(waiting) == 2, st["waiting"]
    _reasons_named(st["waiting"])
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


#: Run by berthd's interpreter at its start (``sitecustomize``): it waits until the test opens
#: the FIFO for writing, as a loaded machine keeps berthd from answering for seconds.
_HOLD = """import os
if os.environ.get("BERTH_TEST_HOLD"):
    with open(os.environ["BERTH_TEST_HOLD"]) as f:
        f.read()
"""


def _let_go(fifo) -> bool:
    """Open the FIFO for writing once berthd waits on it (``ENXIO``: not yet): berthd goes on."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as e:
        if e.errno == errno.ENXIO:
            return False
        raise
    return True


def test_five_autostarting_berth_runs_wait_for_a_berthd_still_starting(stack_factory, tmp_path):
    """Issue 37 (Supervisor #122), the flaky host page: berthd starts beside the runs and does
    not answer yet; before, the first runs failed open (engines unleased) and berthd, once up,
    granted the others beside them."""
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(_HOLD)
    fifo = tmp_path / "berthd-hold"
    os.mkfifo(fifo)
    names = [f"p{i}" for i in range(1, 6)]
    pythonpath = os.pathsep.join([str(hold), str(REPO), os.environ.get("PYTHONPATH", "")])
    s = stack_factory([Prog(n, _run_cmd(n), startsecs=1) for n in names], wait_up=False,
                      berthd_env={"PYTHONPATH": pythonpath, "BERTH_TEST_HOLD": str(fifo)})
    # Every run has met the silent berthd and said what it does about it.
    wait_for(lambda: all("berthd is not" in s.log(f"{n}.log") for n in names), 120,
             "every run to find berthd not answering")
    said = {n: s.log(f"{n}.log") for n in names}
    assert not [n for n, log in said.items() if "UNLEASED" in log], said
    for n, log in said.items():
        assert "is still starting" in log and "waits for it" in log, (n, log)
    wait_for(lambda: _let_go(fifo), 60, "berthd to wait on its hold")
    wait_for(lambda: s.berth("status", "--json", check=False).returncode == 0, 60,
             "berthd to answer")
    wait_for(lambda: len([n for n in names if s.active(n)]) == 3
             and len(s.status()["waiting"]) == 2, 60, "three leases active, two waiting")
    _reasons_named(s.status()["waiting"])
    wait_for(lambda: all(s.info(n).statename == "RUNNING" for n in names), 30,
             "all five RUNNING in supervisord")
    for n in names:
        assert "UNLEASED" not in s.log(f"{n}.log"), (n, s.log(f"{n}.log"))
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


def _drained_waiter(s, names: list[str]) -> str | None:
    """The one program whose run was drained and asks for its card again: it waits in
    berthd's queue and its run is listed as drained (issue 35), while the other two hold the
    card and have said they serve (their turns have begun: a drain back would be planned
    now)."""
    gone = {n: s.info(n).statename for n in names} if s.status()["counters"]["drains"] else {}
    assert not {n for n, state in gone.items() if state != "RUNNING"}, gone
    st = s.status()
    waiting = [w["engine"] for w in st["waiting"]]
    drained = [r["engine"] for r in st["drained"] if r.get("asking")]
    active = [n for n in names if s.active(n)]
    ready = [le["engine"] for le in st["leases"] if le.get("ready")]
    if len(waiting) == 1 and drained == waiting and len(active) == 2 \
            and set(active) <= set(ready):
        return waiting[0]
    return None


def test_a_drained_program_without_a_front_stays_running_and_waits_its_turn(stack_factory):
    """docs/hosts/supervisord.md's example (min_turn 0s, three frontless programs of 10 GiB on
    a card that fits two, supervisord's default ``autorestart=unexpected``): the waiter drains
    a holder, and that holder's run, with no front to hold a request, stays and asks berthd for
    its card again at once. Before, it exited 0 and supervisord left it EXITED for good. It
    waits its turn: it makes no room for itself (no drain back, so no thrash), and is granted
    when a holder stops; it exits only when signalled."""
    names = ["p1", "p2", "p3"]
    s = stack_factory([Prog(n, _run_cmd(n, size="10GiB", weights="9GiB"), startsecs=1,
                            autorestart="unexpected") for n in names],
                      policy={"min_turn": "0s"})
    waiter = wait_for(lambda: _drained_waiter(s, names), 120,
                      "one drained program asking again, two serving")
    why = s.waiting(waiter)["why"]
    assert "drained" in why and "no front" in why, why
    # No drain back: the one drain was the first waiter's (the juggle guard would allow 4).
    assert s.status()["counters"]["drains"] == 1, s.status()["counters"]
    assert all(s.info(n).statename == "RUNNING" for n in names), \
        {n: s.info(n).statename for n in names}
    board = s.berth("status").stdout
    assert waiter in board.split("waiting:")[1] and "needs gpu0 10.0GiB" in board, board
    # A holder stops: the drained program is granted and its engine starts again.
    s.ctl("stop", next(n for n in names if n != waiter and s.active(n)))
    wait_for(lambda: s.active(waiter) and s.active(waiter)["ready"], 120,
             f"{waiter} granted and serving again")
    assert s.info(waiter).statename == "RUNNING"
    assert "exited on its own" not in s.log(f"{waiter}.log")
    assert s.oom_events() == 0
