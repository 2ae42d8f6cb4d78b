"""A state file berthd cannot write (a full disk, a read-only state directory): said once, in
one line that names the file and what to do, without a traceback; said again when it is
written again (review finding: a disk-full state directory printed a traceback per change)."""

from __future__ import annotations

import os

from tests.helpers import wait_for


def _lease(d, engine: str) -> None:
    code, r = d.call("POST", "/v1/leases", {"engine": engine, "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "1GiB"}]})
    assert code == 201, r


def test_a_state_file_that_cannot_be_written_is_said_once_without_a_traceback(berthd, tmp_path):
    d = berthd()
    state = tmp_path / "state" / "state.toml"
    wait_for(state.exists, what="the first state file")
    # A directory where the file goes: every atomic write's rename fails, as on a full disk.
    state.unlink()
    state.mkdir()
    _lease(d, "A")
    _lease(d, "B")
    state.rmdir()
    _lease(d, "C")
    wait_for(lambda: "is written again" in d.log.read_text(), what="the recovery said")
    log = d.log.read_text()
    assert "Traceback" not in log, log
    failed = [line for line in log.splitlines() if "cannot write the state file" in line]
    assert len(failed) == 1, log
    assert str(state) in failed[0] and "restart" in failed[0]
    assert 'engine = "C"' in state.read_text()
