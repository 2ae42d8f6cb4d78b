"""A file planted at a shared path (issue 36, "A planted lock hangs every run"): a FIFO made at
the fail-open lock's path made every ``berth run`` block in ``open`` forever, deaf to SIGTERM
(``/dev/shm`` is writable by everyone). A FIFO, a symlink and a directory at each shared path
(the real cards' lock in ``/dev/shm``, the simulated cards' ``failopen.lock`` and
``cards.lock``): refused with a message naming the path and its owner, and the run goes on."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from berth import paths
from berth.run.failopen import StartLock

from tests.berthd import BERTH
from tests.helpers import wait_for
from tests.run.world import run_cmd

KINDS = ("fifo", "symlink", "directory")


def _plant(path: Path, kind: str, target: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o666)
    elif kind == "symlink":
        target.write_text("someone else's file\n")
        os.symlink(target, path)
    else:
        os.mkdir(path)


def _unblock(path: Path) -> None:
    """A reader blocked in ``open`` of the FIFO at ``path`` (before the fix) is let go."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _bounded(call, path: Path, limit_s: float = 5.0):
    """``call()`` in a thread, failing the test if it has not returned within ``limit_s``."""
    out: dict = {}

    def go():
        try:
            out["value"] = call()
        except BaseException as e:          # noqa: BLE001 (handed to the test)
            out["error"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        _unblock(path)
        t.join(5)
        pytest.fail(f"opening {path} blocked for {limit_s:.0f}s")
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["world-writable", "private"])
def test_a_planted_lock_is_refused_at_once_naming_path_and_owner(tmp_path, kind, where):
    # A sticky world-writable directory stands for /dev/shm (any owner is fine there); a
    # private one for the simulated cards' directory.
    d = tmp_path / "shm"
    d.mkdir()
    os.chmod(d, 0o1777 if where == "world-writable" else 0o755)
    lock = d / "berth-failopen.lock"
    _plant(lock, kind, tmp_path / "target")
    out = _bounded(lambda: StartLock(lock).take(), lock)
    e = out.get("error")
    assert isinstance(e, paths.UnsafePath), out
    said = str(e)
    assert str(lock) in said and "owned by uid 0 (root)" in said, said
    assert {"fifo": "a FIFO", "symlink": "a symlink", "directory": "a directory"}[kind] in said


def test_a_lock_others_can_write_is_refused_a_good_one_is_taken(tmp_path):
    lock = tmp_path / "failopen.lock"
    lock.write_text("")
    os.chmod(lock, 0o666)
    with pytest.raises(paths.UnsafePath, match="mode 0666"):
        StartLock(lock).take()
    lock.unlink()
    first, second = StartLock(lock), StartLock(lock)
    assert first.take() is None and (lock.stat().st_mode & 0o777) == 0o644
    assert second.take() is not None            # held: who holds it, in words
    first.release()


@pytest.mark.parametrize("name", ["cards.lock", "cards.json"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_simulated_cards_files_planted_are_refused(tmp_path, kind, name):
    sim = tmp_path / "sim"
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(sim)], check=True, capture_output=True, timeout=60)
    lock = sim / name
    saved = sim / f"{name}.saved"
    lock.rename(saved)
    _plant(lock, kind, tmp_path / "target")
    from berth.sim.cards import SimCards
    from berth.sim.store import SimError
    try:
        out = _bounded(lambda: SimCards(sim).snapshot(), lock)
    finally:
        # The suite's OOM count reads every cards.json it saw: the real one goes back.
        _unblock(lock)
        lock.rmdir() if kind == "directory" else lock.unlink()
        saved.rename(lock)
    assert isinstance(out.get("error"), SimError), out
    assert str(lock) in str(out["error"]) and "uid 0 (root)" in str(out["error"])


@pytest.mark.parametrize("kind", KINDS)
def test_berthd_down_a_planted_lock_the_run_goes_on_unleased(world, kind):
    """The simulated cards' ``failopen.lock`` planted: the run says so (path, owner) and starts
    its engine unleased without the lock, within 5 s of its first line; it stops on SIGTERM."""
    sim = world.tmp / "sim"
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0",
                    "--dir", str(sim)], check=True, capture_output=True, timeout=60)
    lock = sim / "failopen.lock"
    _plant(lock, kind, world.tmp / "target")
    a = world.model("A", run_cmd("A"))
    try:
        a.spawn()
        wait_for(lambda: world.log("A").strip(), 60, "the run's first line")
        t0 = time.monotonic()
        wait_for(lambda: "UNLEASED (fail-open)" in world.log("A"), 30, "A started unleased")
        took = time.monotonic() - t0
    finally:
        _unblock(lock)
    said = world.log("A")
    assert "the fail-open lock is refused" in said and str(lock) in said, said
    assert "owned by uid 0 (root)" in said, said
    assert took < 5, (took, said)
    a.wait_ready()
    st = a.stop()
    assert st.exit_code == 0 and not st.killed, st


def _no_holder(lock: Path) -> None:
    """Fails the test when a Berth on this machine holds the real cards' lock now (a lock file
    left behind by a finished run is fine: it is replaced for the test)."""
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        pytest.fail(f"{lock} is not a regular file: remove it")
    if not lock.exists():
        return
    import fcntl
    fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pytest.fail(f"{lock} is held: another Berth on this machine uses it now")
    finally:
        os.close(fd)


def test_real_cards_lock_in_dev_shm_planted_the_run_does_not_hang(world):
    """``/dev/shm/berth-failopen.lock`` (the real cards' lock) a FIFO: a run on real cards (here
    none can be read) says the lock is refused and goes on to measure; SIGTERM stops it."""
    lock = Path("/dev/shm/berth-failopen.lock")
    _no_holder(lock)
    cfg = world.tmp / "real.toml"
    cfg.write_text(f'state_dir = "{world.tmp / "state"}"\n[board]\nlisten = "off"\n')
    env = dict(world.env, BERTH_CONFIG=str(cfg))
    # Renamed over whatever is there: a run on real cards leaves the lock file behind (it is
    # never removed, by design), and a CI run's earlier test may have made it.
    fifo = lock.with_name(f"berth-planted-{os.getpid()}.fifo")
    os.mkfifo(fifo, 0o666)
    os.rename(fifo, lock)
    log = world.tmp / "run-real.log"
    try:
        with open(log, "w") as out:
            p = subprocess.Popen([BERTH, "run", "--engine", "A", "--size", "1GiB", "--", "sleep",
                                  "60"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: "the fail-open lock is refused" in log.read_text(), 30,
                     "the refusal in the run's log")
            p.terminate()
            assert p.wait(30) is not None
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    finally:
        _unblock(lock)
        lock.unlink()
    said = log.read_text()
    assert str(lock) in said and "a FIFO" in said and "owned by uid 0 (root)" in said, said
    assert "Traceback" not in said, said
