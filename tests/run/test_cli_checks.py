"""``berth run``'s own checks of its options, said before it asks berthd for anything."""

from __future__ import annotations

import os
import subprocess

from tests.berthd import BERTH


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
