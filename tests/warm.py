"""Bytecode written once, before the workers start (issue 38: the suite's length on two cores).

In a fresh clone no module has its bytecode yet. Every xdist worker collects the whole suite, so
all ten compiled Berth's modules and rewrote the test modules' assertions at the same moment,
each for itself: a cold collection cost 8.4 CPU-s a worker against 3.3 once the bytecode is on
disk (84 CPU-s against 33 at the start of a fresh clone's run, about 20 s on two cores). The
controller writes it first (:func:`warm`): the standard bytecode of the packages and the tests'
helpers (:mod:`compileall`), and pytest's rewritten bytecode of each test module and conftest.

The rewrite uses pytest's own functions (``_pytest.assertion.rewrite``, private): a pytest
without them, or any error here, leaves the bytecode to the workers, as before. Nothing is
rewritten that is already on disk and current (a second run pays one read of each header).
"""

from __future__ import annotations

import compileall
import fnmatch
from pathlib import Path

import pytest

__all__ = ["warm", "rewritten_files"]


def rewritten_files(config: pytest.Config) -> list[Path]:
    """The files pytest rewrites under the paths this run collects: those matching
    ``python_files``, and every ``conftest.py``."""
    patterns = config.getini("python_files")
    found: set[Path] = set()
    for arg in config.args:
        path = Path(str(arg).split("::")[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir, path)
        files = path.rglob("*.py") if path.is_dir() else [path] if path.suffix == ".py" else []
        found.update(f for f in files if f.name == "conftest.py" or any(
            fnmatch.fnmatch(f.name, p) for p in patterns))
    return sorted(found)


def _rewrite(config: pytest.Config, files: list[Path]) -> int:
    """Write pytest's rewritten bytecode of each of ``files`` that lacks a current one; how
    many were written."""
    from _pytest.assertion import assertstate_key, rewrite

    state = config.stash[assertstate_key]
    written = 0
    for fn in files:
        cache = rewrite.get_cache_dir(fn)
        pyc = cache / (fn.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(fn, pyc) is not None:
            continue
        if not rewrite.try_makedirs(cache):
            continue
        stat, code = rewrite._rewrite_test(fn, config)
        written += bool(rewrite._write_pyc(state, code, stat, pyc))
    return written


def warm(config: pytest.Config, folders: list[Path]) -> int:
    """Compile ``folders`` (the packages, the tests) and rewrite this run's test modules; the
    number of test modules rewritten, or -1 when pytest's functions were not there."""
    for folder in folders:
        compileall.compile_dir(str(folder), quiet=2, workers=2)
    try:
        return _rewrite(config, rewritten_files(config))
    except (ImportError, AttributeError, KeyError, TypeError, OSError, SyntaxError):
        return -1
