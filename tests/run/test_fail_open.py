"""``berth run`` fails open (issue 5; seed 002 "Why the run owns the front": "With berthd down it
still forwards"): berthd down at the start, and berthd killed and restarted under a serving run."""

from __future__ import annotations

import subprocess

import pytest

from tests.berthd import BERTH
from tests.helpers import wait_for
from tests.run.llamaswap import UNLOAD_TIMEOUT_S
from tests.run.world import chat, run_cmd


def test_berthd_down_at_start_the_run_warns_and_serves_unleased(world):
    # The simulated card exists (as a real one would); no berthd runs.
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(world.tmp / "sim")], check=True, capture_output=True)
    assert not world.d.sock.exists()
    a = world.model("A", run_cmd("A"))
    a.start()
    assert "UNLEASED (fail-open)" in world.log("A")
    for _ in range(2):
        ans = chat(a.port, "A", max_tokens=6)
        assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    # berthd comes up: the run leases its running engine (it keeps serving meanwhile).
    d = world.start_berthd()
    le = wait_for(lambda: d.lease_of("A"), 60, "the run's lease")
    wait_for(lambda: d.state_of("A") == "active" and (d.lease_of("A") or {}).get("pid"), 60,
             "the lease granted and attached")
    assert d.lease_of("A")["pid"] == world.engine_pid("A") == le["pid"]
    # The engine ran before berthd measured the card: its bytes left the baseline on adoption.
    assert d.status()["cards"][0]["baseline_bytes"] == 0
    ans = chat(a.port, "A", max_tokens=6)
    assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    st = a.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st


def test_berthd_killed_the_run_keeps_serving_and_reattaches_when_it_is_back(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    a.start()
    before = d.lease_of("A")
    pid = world.engine_pid("A")
    d.kill9()
    for _ in range(2):                      # the front forwards with berthd gone
        ans = chat(a.port, "A", max_tokens=6)
        assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    d.start()
    after = d.lease_of("A")
    assert after["id"] == before["id"] and after["pid"] == pid, (before, after)
    assert d.state_of("A") == "active"
    # Instructions reach the run again: the operator parks it through the new berthd...
    out = subprocess.run([BERTH, "park", "A"], env=world.env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: d.state_of("A") == "parked", 60, "A parked through the new berthd")
    # ...and a write to the front wakes it through the new berthd.
    ans = chat(a.port, "A", max_tokens=6)
    assert ans.content_chunks == 6 and ans.finish_reason == "length", ans
    wait_for(lambda: d.state_of("A") == "active", 30, "A's wake reported")
    assert [c.oom_events for c in world.sim().cards] == [0]
    st = a.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st


def _sim_card(world) -> None:
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(world.tmp / "sim")], check=True, capture_output=True)


def test_berthd_down_a_run_that_does_not_fit_waits_for_berthd(world):
    """Issue 26: with berthd down, B (14 GiB) does not fit beside A (13 GiB held of 24 GiB, a
    1 GiB reserve): B starts no engine and says it waits for berthd; A keeps serving. Once
    berthd is back, A (unleased) registers and is admitted like a stowaway, and B is leased in
    its turn. No out-of-memory event on the card."""
    _sim_card(world)
    a = world.model("A", run_cmd("A"))
    a.start()
    b = world.model("B", run_cmd("B"))
    b.spawn()
    wait_for(lambda: "Waiting for berthd" in world.log("B") or "started B" in world.log("B"),
             30, "B to say it waits")
    assert "started B" not in world.log("B") and b.running(), world.log("B")
    assert "does not fit beside what gpu0 holds" in world.log("B"), world.log("B")
    assert len(world.sim().cards[0].processes) == 1          # A's engine only
    assert "UNLEASED (fail-open): it fits beside what the cards hold" in world.log("A")
    assert chat(a.port, "A", max_tokens=4).content_chunks == 4
    d = world.start_berthd()
    # A may be parked for B at once (B can ask before A registers): registered and attached
    # is what counts here, in whichever state the ladder then puts it.
    wait_for(lambda: d.state_of("A") in ("active", "parking", "parked")
             and (d.lease_of("A") or {}).get("pid"), 20, "A registered and attached")
    b.wait_ready()                          # B's lease: the ladder parks A for it
    ans = chat(b.port, "B", max_tokens=4)
    assert ans.content_chunks == 4, ans
    assert [c.oom_events for c in world.sim().cards] == [0]


def test_berthd_down_past_the_start_limit_the_run_gives_up(world):
    _sim_card(world)
    a = world.model("A", run_cmd("A"))
    a.start()
    b = world.model("B", run_cmd("B", run_args=("--start-limit", "2s")))
    b.spawn()
    assert b.proc.wait(60) == 1, world.log("B")
    assert "did not come back within --start-limit 2s" in world.log("B"), world.log("B")
    assert "started B" not in world.log("B")
    assert [c.oom_events for c in world.sim().cards] == [0]


@pytest.mark.parametrize("size,run_args,shown", [
    ("14GiB", (), "it answers its health check"),
    ("13GiB", ("--health", "none"), "its memory shows on the card")], ids=["health", "memory"])
def test_berthd_down_two_runs_started_together_do_not_both_start(world, size, run_args, shown):
    """Two runs started at the same moment with berthd down, each asking 14 GiB, or 13 GiB (an
    engine whose 13 GiB of weights are on the card, its load held open by ``--load-hold``
    while the test looks) of a 24 GiB card with a 1 GiB reserve: each fits alone, not both. Both measured the empty card and both started; the second engine's
    allocation failed (an out-of-memory event on the card). The fail-open decision is
    serialised: exactly one starts unleased; the other says it waits for that run, measures once
    the first engine's memory shows on the card (its health check answers; without one, its
    process uses the 13 GiB asked), and waits for berthd; once the first is stopped it starts."""
    _sim_card(world)
    hold = world.tmp / "load-hold"          # both engines' loads end only once it is removed
    hold.touch()
    runs = {n: world.model(n, run_cmd(n, size=size, run_args=run_args,
                                      engine_args=("--load-hold", str(hold)))) for n in "AB"}
    for m in runs.values():
        m.spawn()

    def told():
        logs = {n: world.log(n) for n in runs}
        started = [n for n, t in logs.items() if "UNLEASED (fail-open)" in t]
        waits = [n for n, t in logs.items() if "holds the fail-open lock" in t]
        return (started, waits) if len(started) == 2 or (started and waits) else None
    started, waits = wait_for(told, 90, "one run started, the other waiting for its lock")
    assert len(started) == 1 and waits != started, (started, waits)
    if not run_args:
        # The first engine's load is held: its health check does not answer, so the lock is
        # still held and the other has measured nothing yet.
        assert not any("does not fit beside" in world.log(n) for n in runs), waits
        hold.unlink()

    def settled():
        logs = {n: world.log(n) for n in runs}
        started = [n for n, t in logs.items() if "UNLEASED (fail-open)" in t]
        measured = [n for n, t in logs.items() if "does not fit beside what gpu0 holds" in t]
        return (started, measured, logs) if len(started) == 2 or (started and measured) else None
    started, measured, logs = wait_for(settled, 90, "one run started, the other measured it")
    assert len(started) == 1 and measured != started, logs
    first, second = started[0], measured[0]
    said = world.log(second)
    assert f"berth run --engine {first} (pid {runs[first].pid}" in said, said
    assert "holds the fail-open lock" in said and "started " + second not in said, said
    # (Without a health check, the lock was let go on the memory alone, the load still held.)
    hold.unlink(missing_ok=True)
    runs[first].wait_ready()
    assert f"{first} started unleased and {shown}: the fail-open lock is let go" in \
        world.log(first), world.log(first)
    assert runs[second].running() and "started " + second not in world.log(second)
    assert len(world.sim().cards[0].processes) == 1, world.sim().cards[0]
    assert [c.oom_events for c in world.sim().cards] == [0]
    st = runs[first].stop()
    assert st.exit_code == 0 and not st.killed, st
    runs[second].wait_ready()               # it measures again: the card is free, it starts
    assert "UNLEASED (fail-open)" in world.log(second), world.log(second)
    assert chat(runs[second].port, second, max_tokens=4).content_chunks == 4
    assert [c.oom_events for c in world.sim().cards] == [0]


def _no_berthd(tmp) -> dict:
    """berthd's config on a simulated 24 GiB card, the card declared, no berthd started: the
    environment for a run (its socket does not exist)."""
    import os

    from tests.berthd import sim_config
    cfg = sim_config(tmp, [("gpu0", "24GiB")])
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0", "--dir",
                    str(tmp / "sim")], check=True, capture_output=True)
    return {**os.environ, "BERTH_CONFIG": str(cfg)}


def test_berthd_down_the_wait_is_said_at_once_with_what_to_do(tmp_path):
    """A new user's run with no berthd said one line and then nothing for 120 s: the first
    line says what it waits for (berthd, at which socket, and why it is not there), how long
    is left, and what the user can do (start berthd, a shorter --start-limit)."""
    env = _no_berthd(tmp_path)
    out = subprocess.run([BERTH, "run", "--engine", "x", "--size", "99GiB", "--start-limit",
                          "3s", "--", "true"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1, out.stderr
    first = out.stderr.splitlines()[0]
    sock = tmp_path / "state" / "berthd.sock"
    for words in (f"berthd is not reachable at {sock}: no such file",
                  "start berthd with `berthd`", "not starting x unleased: 99.0GiB does not fit",
                  "3s left of --start-limit 3s, then x does not start",
                  "it starts as soon as berthd answers"):
        assert words in first, out.stderr
    assert "ssl:" not in out.stderr and "Traceback" not in out.stderr


def test_berthd_down_the_wait_is_said_again_every_15_seconds(tmp_path, monkeypatch, caplog):
    """Between the first line and the end of --start-limit the run reminds the wait every
    15 s (a clock the test moves: no real wait), with the time left."""
    import asyncio
    import logging

    from berth.client import BerthdUnavailable, Client
    from berth.run.cli import RunOptions
    from berth.run.failopen import FailOpen
    env = _no_berthd(tmp_path)
    monkeypatch.setenv("BERTH_CONFIG", env["BERTH_CONFIG"])
    o = RunOptions(cmd=["true"], engine="x", sizes=[(None, "99GiB")], start_limit_s=40.0)
    now = [0.0]
    wait = FailOpen(o, clock=lambda: now[0])

    async def steps() -> list:
        client = Client()
        try:
            await client.status()
        except BerthdUnavailable as e:
            error = e
        finally:
            await client.close()
        out = []
        for t in (0, 5, 14, 15, 20, 29, 30, 35, 39, 40):
            now[0] = float(t)
            out.append((t, await wait.step(error)))
        return out

    caplog.set_level(logging.WARNING, logger="berth.run")
    results = asyncio.run(steps())
    assert [r for _, r in results] == [False] * 9 + [None]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4, said                 # at once, at 15 s, at 30 s, and the end
    assert "40s left of --start-limit 40s" in said[0] and "--start-limit 10s waits less" in said[0]
    for line, left in ((said[1], 25), (said[2], 10)):
        assert line.startswith(f"still waiting for berthd ({left}s left of --start-limit 40s, "
                               f"then x does not start; --start-limit 10s waits less): berthd "
                               f"is not reachable at "), line
        assert "start berthd with `berthd`" in line and "99.0GiB does not fit" in line, line
    assert "did not come back within --start-limit 40s" in said[3]


def test_berthd_down_the_fail_open_lock_held_is_waited_on_and_unsafe_is_passed_by(tmp_path, monkeypatch):
    """The fail-open lock (the simulated cards' directory holds it): held by another process,
    the run does not measure and names the holder; a symlink in its place is not followed, and
    the run measures without it (issue 36). Free again, the run takes it, and lets it go once."""
    import os

    from berth.run.cli import RunOptions
    from berth.run.failopen import FailOpen, StartLock
    env = _no_berthd(tmp_path)
    monkeypatch.setenv("BERTH_CONFIG", env["BERTH_CONFIG"])
    monkeypatch.delenv("BERTH_SIM_DIR", raising=False)
    o = RunOptions(cmd=["true"], engine="x", sizes=[(None, "1GiB")])
    path = tmp_path / "sim" / "failopen.lock"
    other = StartLock(path)
    assert other.take() is None
    room = FailOpen(o)._turn()
    assert not room.fits and room.busy, room
    assert f"(pid {os.getpid()}, user " in room.why and str(path) in room.why, room.why
    other.release()
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    # Refused (issue 36: a planted file must not hold every run up), the run measures without
    # the lock; the symlink is not followed.
    run = FailOpen(o)
    room = run._turn()
    assert room.fits and not room.busy and run.lock is None, room
    assert not (tmp_path / "elsewhere").exists()
    path.unlink()
    run = FailOpen(o)
    room = run._turn()
    assert room.fits and run.lock is not None, room
    assert path.stat().st_mode & 0o777 == 0o644          # every user opens it
    assert other.take() is not None             # held by the run that fits
    run.let_go("test")
    assert other.take() is None and run.lock is None
    other.release()
