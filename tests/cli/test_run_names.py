"""``berth run`` with an engine name berthd's API would refuse: one line naming ``--engine`` and
the value, before any lease is asked for (a fresh user's check, 2026-12-03: the refusal came back
from berthd as a regular expression, ``String should match pattern '^[^\\s\\x00-\\x1f\\x7f]+$'``)."""

from __future__ import annotations

import subprocess

import pytest

from tests.berthd import BERTH


# The cases share one berthd (issue 38), on one worker: each is refused before it asks for a
# lease, and checks that none was made.
@pytest.mark.xdist_group("run_names")
@pytest.mark.parametrize("name,args", [
    ("bad name!", ["--engine", "bad name!"]),
    ("my engine", []),                   # the default name: the command's file name
    # "$" matched before a last newline: the run let it through, and berthd refused it
    ("trail\n", ["--engine", "trail\n"]),
    # an empty --engine (an unset variable in a manager's line) ran as the command's name
    ("", ["--engine", ""]),
])
def test_an_engine_name_with_a_space_is_one_line_naming_it(shared_berthd, tmp_path, name, args):
    d = shared_berthd()
    cmd = str(tmp_path / "my engine")
    p = subprocess.run([BERTH, "run", *args, "--size", "1GiB", "--", cmd], capture_output=True,
                       text=True, env=d.env, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr == (f"berth run: --engine: {name!r}: an engine's name has no spaces or "
                        f"control characters (1 to 200 of them)\n"), p.stderr
    assert d.status()["leases"] == [] and "pattern" not in p.stderr
