"""Where the suite's CPU goes: an opt-in pytest plugin (issue 38).

``.venv/bin/python -m pytest -q -p tests.cpu_report [PATHS]`` records, for each test, the CPU
seconds (user + system) of the test process and of the processes it started and reaped (berthd,
``berth run``, engines), and at the end prints the files that used the most, with the total.
With xdist, each worker appends its lines to ``$BERTH_CPU_REPORT`` (default
``.pytest_cache/cpu-report.jsonl``, emptied when the run starts) and the controller sums them.

The suite is CPU-bound on two cores: its length there can be no less than its CPU over the
cores (``.ci/run`` prints both). A process that outlives its test, or is killed and never
reaped, is not counted, so the figures are lower bounds.
"""

from __future__ import annotations

import collections
import json
import os
import resource
from pathlib import Path

import pytest

_TOP = 15


def _path(config: pytest.Config) -> Path:
    named = os.environ.get("BERTH_CPU_REPORT")
    return Path(named) if named else Path(config.rootpath) / ".pytest_cache" / "cpu-report.jsonl"


def _cpu() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):      # the controller (or a run without xdist)
        path = _path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    before = _cpu()
    yield
    line = json.dumps({"id": item.nodeid, "cpu_s": round(_cpu() - before, 3)})
    with open(_path(item.config), "a") as f:
        f.write(line + "\n")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    by_file: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for line in _path(config).read_text().splitlines():
        row = json.loads(line)
        name = row["id"].split("::")[0]
        by_file[name] += row["cpu_s"]
        count[name] += 1
    total = sum(by_file.values())
    tr = terminalreporter
    tr.section("CPU by test file (seconds, this process and the ones it reaped)")
    for name, cpu in by_file.most_common(_TOP):
        tr.write_line(f"{cpu:8.1f}  {count[name]:4d} tests  {name}")
    tr.write_line(f"{total:8.1f}  {sum(count.values()):4d} tests  in all")
