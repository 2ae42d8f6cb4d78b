"""A full disk (issue 36): the state directory fills up while the state is written, then berthd
is killed in that window: the restart had lost the state. Now the last good file stays, berthd
says so once and serves from memory, the restart (kill -9, the disk still full) has every lease
of the last good state, and once there is room the state is written again without waiting for
a change. The state directory is a small tmpfs (the tests run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.berthd import Berthd, sim_config
from tests.helpers import stop_all, wait_for


@pytest.fixture
def small_state(tmp_path):
    """``tmp_path/state``: a 1 MiB tmpfs, unmounted at the end."""
    state = tmp_path / "state"
    state.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.fail("needs root to mount a tmpfs (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)],
                   check=True)
    yield state
    subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(state: Path) -> Path:
    """Fill the file system of ``state`` to the last byte; the filler's path."""
    filler = state / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _lease(d: Berthd, engine: str) -> str:
    code, r = d.call("POST", "/v1/leases", {"engine": engine, "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "1GiB"}]})
    assert code == 201, r
    return r["id"]


def test_a_full_disk_keeps_the_last_good_state_through_a_kill_9(tmp_path, small_state):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    try:
        good = {_lease(d, "A"), _lease(d, "B")}
        state = small_state / "state.toml"
        wait_for(lambda: state.exists() and 'engine = "B"' in state.read_text(), 30,
                 "A and B in the state file")
        filler = _fill(small_state)
        late = _lease(d, "C")                     # its write fails: the disk is full
        _lease(d, "D")
        wait_for(lambda: "cannot write the state file" in d.log.read_text(), 30,
                 "the failed write said")
        text = state.read_text()
        assert 'engine = "B"' in text and 'engine = "C"' not in text, text
        assert {le["id"] for le in d.status()["leases"]} >= good | {late}   # from memory
        failed = [ln for ln in d.log.read_text().splitlines()
                  if "cannot write the state file" in ln]
        assert len(failed) == 1 and str(state) in failed[0], failed
        assert not [p for p in small_state.iterdir() if p.name.endswith(".tmp")]
        d.kill9()
        d.start()                                 # the disk is still full
        ids = {le["id"] for le in d.status()["leases"]}
        assert good <= ids, (good, ids, d.log.read_text()[-3000:])
        assert "Traceback" not in d.log.read_text()
        # Room again: written again without waiting for a change, with C and D gone (the
        # restart had only the last good state).
        before = d.log.read_text().count("is written again")
        filler.unlink()
        wait_for(lambda: d.log.read_text().count("is written again") > before, 30,
                 "the state written again once there is room")
        assert set(ids) <= {le["id"] for le in d.status()["leases"]}
    finally:
        stop_all([d.proc], None)
