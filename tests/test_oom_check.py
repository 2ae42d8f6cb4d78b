"""The suite's OOM check (tests/conftest.py) on a small suite of its own, run as a pytest process,
alone and under pytest-xdist: an OOM that a test does not declare fails it, a declared one does
not, and one counted after the last test fails the run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import subprocess, sys
import pytest
from berth.sim.cards import CardSpec, SimCards

GiB = 1 << 30

def overfill(directory):
    """A real process that asks a 4 GiB card for 5 GiB (the store counts the OOM)."""
    code = ("import sys; from berth.sim.cards import SimCards, SimOOM\\n"
            "try: SimCards(sys.argv[1]).alloc('0000:01:00.0', 5 << 30)\\n"
            "except SimOOM: sys.exit(3)")
    assert subprocess.run([sys.executable, "-c", code, str(directory)]).returncode == 3

@pytest.fixture
def card(tmp_path):
    SimCards.init(tmp_path / "sim", [CardSpec.make("gpu0", 4 * GiB, pci="0000:01:00.0")])
    return tmp_path / "sim"

@pytest.mark.expect_oom
def test_declared(card):
    overfill(card)

def test_undeclared(card):
    overfill(card)

def test_quiet(card):
    SimCards(card).alloc("0000:01:00.0", GiB)
'''

#: A plugin whose session-end hook runs before the check's: an OOM after the last test, in the
#: process (the one pytest, or the xdist worker) that ran ``test_quiet``.
LATE = '''
from pathlib import Path
import pytest
from test_suite import overfill

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    for sim in Path(session.config.option.basetemp).glob("test_quiet0/sim"):
        overfill(sim)
'''


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_an_undeclared_oom_fails_its_test_and_a_declared_one_does_not(tmp_path, xdist):
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "late.py").write_text(LATE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "late", *xdist, "--rootdir", str(tmp_path),
                          f"--basetemp={tmp_path / 'base'}", str(tmp_path / "test_suite.py")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    out = run.stdout
    assert run.returncode == 1, out
    assert "3 passed, 1 error" in out, out     # test_undeclared passes, then errs
    assert "ERROR test_suite.py::test_undeclared" in out
    assert "1 simulated OOM on card gpu0" in out
    assert "after the last test: 1 simulated OOM on card gpu0" in out
    assert "3 card directories read, 1 OOM expected (@pytest.mark.expect_oom), 2 not expected" \
        in out
