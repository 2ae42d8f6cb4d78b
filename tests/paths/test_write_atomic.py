"""Every file Berth writes is replaced whole or not at all, by one function (issue 23 "One home
per rule": atomic writes were done four ways with three guarantees)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import pytest
from berth.paths import write_atomic

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_file_is_written_private(tmp_path):
    p = tmp_path / "state.toml"
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    write_atomic(p, b"x" * (1 << 20))                 # more than one write(2) may take
    assert p.read_bytes() == b"x" * (1 << 20)


def test_the_file_and_then_its_directory_are_synced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(stat.S_IFMT(os.fstat(fd).st_mode))
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "f", b"data")
    assert synced == [stat.S_IFREG, stat.S_IFDIR]


def test_a_write_that_fails_midway_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch):
    p = tmp_path / "state.toml"
    p.write_bytes(b"old")
    real = os.write

    def write(fd, data):
        real(fd, bytes(data[:2]))                     # part of it reached the disk
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(p, b"new contents")
    monkeypatch.undo()
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.toml"]


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    (tmp_path / "taken").mkdir()                      # a directory cannot be replaced by a file
    with pytest.raises(OSError):
        write_atomic(tmp_path / "taken", b"data")
    assert os.listdir(tmp_path) == ["taken"]


def test_no_writer_renames_files_of_its_own():
    """The state file, the simulated cards, the supervisord listener's mapping and ``wrap -o``
    all go through :func:`write_atomic`; moving a corrupt state file aside is no write."""
    # write_atomic; the state file's quarantine; the ComfyUI install's folder swap (a folder,
    # not a file written: the old node stays whole until the new one is in place)
    allowed = {("core/paths.py", 1), ("core/daemon/store.py", 1), ("hosts/comfyui/install.py", 2)}
    found = []
    for top in ("core", "hosts", "berth_plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            n = len(re.findall(r"os\.replace\(|os\.rename\(|\.rename\(|mkstemp\(|"
                               r"NamedTemporaryFile\(", text))
            rel = str(path.relative_to(ROOT))
            if n and (rel, n) not in allowed:
                found.append((rel, n))
    assert not found, found
