""":func:`berth.paths.open_shared` against a file that another process replaces by rename (an
atomic write, as the simulated cards' ``cards.json`` is written many times a second)."""

from __future__ import annotations

import os

import pytest
from berth import paths


def test_a_file_replaced_between_open_and_fstat_is_opened_again(tmp_path, monkeypatch):
    """The rename lands between the open and the fstat: the descriptor holds the old file, now
    with 0 links. Before: refused as "a file with 0 links" (UnsafePath), and a stub engine
    reading its card exited mid-run (a supervisord test's program stopped, issue 38)."""
    f = tmp_path / "cards.json"
    f.write_text("old")
    os.chmod(f, 0o644)
    real_open, opened = os.open, []

    def racing_open(path, flags, *a):
        fd = real_open(path, flags, *a)
        if str(path) == str(f) and not opened:
            new = tmp_path / "cards.json.tmp"
            new.write_text("new")
            os.chmod(new, 0o644)
            os.rename(new, f)                       # the writer's atomic replace, just now
        opened.append(path)
        return fd

    monkeypatch.setattr(os, "open", racing_open)
    fd = paths.open_shared(f, os.O_RDONLY, create_mode=None)
    try:
        assert os.read(fd, 10) == b"new"
    finally:
        os.close(fd)
    assert len(opened) == 2


def test_a_hard_link_is_still_refused(tmp_path):
    f = tmp_path / "cards.json"
    f.write_text("x")
    os.chmod(f, 0o644)
    os.link(f, tmp_path / "other")
    with pytest.raises(paths.UnsafePath, match="2 links"):
        paths.open_shared(f, os.O_RDONLY, create_mode=None)
