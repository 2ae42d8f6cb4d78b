"""``berth run``'s own checks of its options, said before it asks berthd for anything."""

from __future__ import annotations

import os
import subprocess

import pytest
from berth.decide.model import MAX_ALIASES

from tests.berthd import BERTH
from tests.helpers import free_port

# The tests that ask berthd share one (issue 38), on one worker: each is refused before it asks
# for anything, and checks that nothing reached berthd.
SHARED = pytest.mark.xdist_group("cli_checks")


def test_lend_without_a_front_is_refused_before_asking_berthd(tmp_path):
    """``--park`` without ``--front`` was refused at once, ``--lend`` without it only by berthd
    once the run asked (and, berthd down, the run waited for it instead): both need a front
    (rule 3), and the run says so itself, exit 2, with no berthd at all."""
    config = tmp_path / "berth.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, "BERTH_STATE_DIR": str(tmp_path / "state"), "BERTH_CONFIG": str(config)}
    r = subprocess.run([BERTH, "run", "--engine", "L", "--size", "1GiB", "--lend",
                        "--require-berthd", "--start-limit", "3s", "--", "true"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--lend needs --front" in r.stderr and "Traceback" not in r.stderr, r.stderr


@SHARED
@pytest.mark.parametrize("alias", ["a b", "tab\there", "line\n", "", "x" * 201])
def test_an_alias_berthd_cannot_take_is_refused_before_anything_starts(shared_berthd, tmp_path,
                                                                        alias):
    """``--alias "a b"`` went to berthd in the lease request: the run's front listened, berthd
    refused the lease in its pattern's words, and the run exited 1 (berthd down, it ran with an
    alias no gateway could route). A model ID has no whitespace or control characters, as an
    engine's name: the run says so itself, exit 2, naming --alias and the value, and nothing
    starts (no lease asked for, no engine)."""
    d = shared_berthd()
    port = free_port()
    marker = tmp_path / "engine-started"
    r = subprocess.run([BERTH, "run", "--engine", "A", "--alias", "ok-alias", "--alias", alias,
                        "--front", f"127.0.0.1:{port}", "--size", "1GiB", "--",
                        "sh", "-c", f"touch {marker}; exec sleep 60", "{port}"],
                       env=d.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--alias" in r.stderr and repr(alias) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not marker.exists()
    assert d.status()["leases"] == []
    assert not any("A" in e["text"] for e in d.timeline()), d.timeline()


@SHARED
def test_more_aliases_than_berthd_takes_are_refused_before_anything_starts(shared_berthd,
                                                                           tmp_path):
    """33 ``--alias`` values went to berthd in the lease request: the run's front listened,
    berthd refused the lease (at most 32), and the run exited 1. The run says so itself, exit 2,
    naming --alias and the limit, and nothing starts."""
    d = shared_berthd()
    port = free_port()
    marker = tmp_path / "engine-started"
    aliases = [a for i in range(MAX_ALIASES + 1) for a in ("--alias", f"m{i}")]
    r = subprocess.run([BERTH, "run", "--engine", "A", *aliases,
                        "--front", f"127.0.0.1:{port}", "--size", "1GiB", "--",
                        "sh", "-c", f"touch {marker}; exec sleep 60", "{port}"],
                       env=d.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--alias" in r.stderr and f"at most {MAX_ALIASES}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not marker.exists()
    assert d.status()["leases"] == []
    assert not any("A" in e["text"] for e in d.timeline()), d.timeline()
