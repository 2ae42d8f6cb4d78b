"""bench/run_start.py runs as shipped (issue 37's open ends): each case starts once on the
script's own setup. Its engine case gave the run no size and no card, so the run could not fail
open, waited for berthd and the case timed out."""

from __future__ import annotations

import os

from bench import run_start


def test_every_case_runs_once_on_the_scripts_own_setup(tmp_path):
    # No berthd anywhere: an xdist worker's variables do not reach the script's runs.
    cases = run_start._cases(str(tmp_path))
    for name, case in cases.items():
        took = case()
        assert 0 < took < run_start._LIMIT_S, (name, took)
    assert not os.path.exists(tmp_path / "absent.sock")
