"""Shared test settings, the suite's fixtures, its OOM check, and its stop on SIGTERM.

``BERTH_HYPOTHESIS=deep`` runs the property tests much longer.

The fixtures every folder uses (``berthd``, ``shared_berthd``, ``runs``) live in
:mod:`tests.fixtures`.

Stop on SIGTERM: every process the suite starts inherits ``BERTH_TEST_RUN`` (a token made once
per run; an xdist worker's children get ``TOKEN/WORKER``), so a pytest stopped by SIGTERM
(``timeout``, a CI runner giving up) first SIGKILLs every process of its run, then dies of the
signal as it would have. A worker ends those it started; the controller ends every one, workers
included.

The OOM check (issue 12, "zero simulated OOM across the whole suite"): Berth promises that no
engine under it is crashed by another's memory, so no test may leave a simulated CUDA OOM behind
unless it makes one on purpose and says so with ``@pytest.mark.expect_oom``. Every declaration
of simulated cards, in any process the suite starts, appends its directory to the file named by
``$BERTH_SIM_REGISTRY`` (:mod:`berth.sim.cards`); cards.json files under a test's ``tmp_path``
are found as well. After each test's teardown the counters of every card whose state changed
are read again: an OOM counted while a test without the marker ran fails that test (as a
teardown error naming the card, its directory and the count); one counted after the last test
fails the run at its end. The summary line says how many OOMs were seen and expected. Under
pytest-xdist each worker runs the check on the tests it runs (its own registry) and sends its
figures to the controller, which prints the sums and fails the run for an OOM after the last
test of any worker.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.fixtures import berthd, runs, shared_berthd  # noqa: F401  (the suite's fixtures)
from tests.helpers import RUN_ENV, slowness, sweep_run

# CI's image sets PYTHONDONTWRITEBYTECODE, so each of the thousands of Python processes the
# suite starts (berthd, berth run, its watchdog, the simulated engines, each a fresh
# interpreter) compiled Berth's modules again from source: about 0.1-0.15 s of CPU per start,
# a sixth of the suite's CPU on two cores. Children inherit this environment; the first writes
# the bytecode beside the checkout (git-ignored), the rest read it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# aiohttp makes two TLS contexts when imported, each loading the system's CA bundle: 0.037 CPU-s
# of a process's 0.2-0.5 (measured: `from aiohttp import web`, 0.226 s against 0.189 s), paid
# by each of the ~1,000 berthds, runs, engines and gateways the suite starts. Nothing the suite
# starts speaks TLS to anything that needs a CA (every peer is on loopback, in plain HTTP), so
# its processes read an empty bundle; a user's own SSL_CERT_FILE is kept.
os.environ.setdefault("SSL_CERT_FILE", os.devnull)

settings.register_profile("ci", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("BERTH_HYPOTHESIS", "ci"))

EXPECT_OOM = "expect_oom"
LONG_MARK, LONG_ENV = "long", "BERTH_RELIABILITY"
EARLY_MARK = "early"


@dataclass
class _Cards:
    """One simulated cards directory: its state file's last seen mtime and OOM counters."""

    mtime_ns: int = -1
    oom: dict[str, int] = field(default_factory=dict)


@dataclass
class _OomCheck:
    registry: Path
    offset: int = 0
    dirs: dict[Path, _Cards] = field(default_factory=dict)
    expected: int = 0
    unexpected: list[str] = field(default_factory=list)
    from_workers: int = 0       # card directories the xdist workers read
    late: bool = False          # an OOM counted after the last test: the run fails

    def find(self, tmp_path: Path | None) -> None:
        """Directories declared since the last look, and state files under ``tmp_path``."""
        try:
            with open(self.registry) as f:
                f.seek(self.offset)
                text = f.read()
        except FileNotFoundError:
            text = ""
        whole = text[:text.rfind("\n") + 1]         # a line still being written waits
        self.offset += len(whole.encode())
        for line in whole.splitlines():
            self.dirs.setdefault(Path(line), _Cards())
        if tmp_path is not None and tmp_path.is_dir():
            for pattern in ("cards.json", "*/cards.json", "*/*/cards.json"):
                for state in tmp_path.glob(pattern):
                    self.dirs.setdefault(state.parent.resolve(), _Cards())

    def counted(self) -> list[tuple[Path, str, int]]:
        """``(directory, card name, new OOM events)`` since the last call."""
        out = []
        for directory, seen in self.dirs.items():
            state = directory / "cards.json"
            try:
                mtime = state.stat().st_mtime_ns
                if mtime == seen.mtime_ns:
                    continue
                data = json.loads(state.read_text())    # written atomically: no lock needed
            except (OSError, ValueError):
                continue
            seen.mtime_ns = mtime
            for card in data.get("cards", []):
                name, now = card.get("name", "?"), int(card.get("oom_events", 0))
                if now > seen.oom.get(name, 0):
                    out.append((directory, name, now - seen.oom.get(name, 0)))
                seen.oom[name] = now
        return out


_CHECK = pytest.StashKey[_OomCheck]()


def _worker(config: pytest.Config) -> str | None:
    """The xdist worker id of this process, None in the controller or a run without xdist."""
    return getattr(config, "workerinput", {}).get("workerid")


def _stop_on_sigterm() -> None:
    """SIGTERM: SIGKILL every process of this run (in a worker, those the worker started), then
    die of the signal with the default handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    token = os.environ[RUN_ENV]

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM ends pytest at once
        sweep_run(token)
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_sigterm)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{LONG_MARK}: a long form (minutes), run only with {LONG_ENV}=long; the "
                   f"default suite leaves it out (deselected, not skipped)")
    config.addinivalue_line(
        "markers", f"{EARLY_MARK}(seconds): the test runs for thirty seconds or more of real "
                   f"time (a workload replayed at its own pace, an install); those marked start "
                   f"before the others, the longest (``seconds``: its length on a quiet two-core "
                   f"machine with the suite beside it) first, in lanes balanced by those seconds, "
                   f"so the suite's wall time is not a tail of such tests started last (a run's "
                   f"summary names the marks far from what their tests took)")
    config.addinivalue_line(
        "markers", f"{EXPECT_OOM}: the test makes a simulated card run out of memory on purpose; "
                   f"without it, any simulated OOM counted while the test runs fails it")
    worker = _worker(config)
    if worker is None or RUN_ENV not in os.environ:
        # A run of its own (a pytest that a test starts is one too).
        os.environ[RUN_ENV] = secrets.token_hex(8)
    else:
        # A worker: what it starts carries the controller's token and the worker's id.
        os.environ[RUN_ENV] = f"{os.environ[RUN_ENV]}/{worker}"
    _stop_on_sigterm()
    if _is_controller(config):
        _warm(config)
    fd, path = tempfile.mkstemp(prefix="berth-sim-registry-", suffix=".txt")
    os.close(fd)
    os.environ["BERTH_SIM_REGISTRY"] = path
    config.stash[_CHECK] = _OomCheck(Path(path))


def _warm(config: pytest.Config) -> None:
    """Before the workers start: the bytecode they would each write at once (tests/warm.py)."""
    import berth
    import berth_hosts

    import berth_plugins
    from tests.warm import warm
    warm(config, [Path(m.__file__).parent for m in (berth, berth_hosts, berth_plugins)]
         + [Path(__file__).parent])


def _is_controller(config: pytest.Config) -> bool:
    """True in the controller of an xdist run (its workers run the tests, it starts nothing)."""
    return _worker(config) is None and bool(getattr(config.option, "numprocesses", None))


def pytest_unconfigure(config: pytest.Config) -> None:
    # What the fixtures left (nothing, when they work) goes with the run.
    if not _is_controller(config):
        sweep_run(os.environ[RUN_ENV])


def _early_s(item: pytest.Item) -> float:
    """The seconds an ``early`` mark gives (60 for a mark without them); -1 for no mark."""
    mark = item.get_closest_marker(EARLY_MARK)
    if mark is None:
        return -1.0
    return float(mark.args[0]) if mark.args else 60.0


#: How many xdist workers at most run the tests marked ``early`` (see :func:`_lanes`).
EARLY_LANES = 5


def _lanes(items: list[pytest.Item]) -> None:
    """Put the tests marked ``early`` (and in no xdist group of their own) in
    :data:`EARLY_LANES` groups, ``early-1``…, balanced by their seconds, longest first: each
    group runs on one worker, one test after another. Those tests replay workloads at their own
    pace and mostly wait; when every worker started on one (there are about twenty), the two
    cores stood half idle for the suite's first two minutes (vmstat: 50-86 % idle) while the
    tests that need the CPU queued behind them. A group takes its place in the queue at its
    first test, so the lanes still start first."""
    load = [0.0] * EARLY_LANES
    for item in items:
        seconds = _early_s(item)
        if seconds < 0 or item.get_closest_marker("xdist_group"):
            continue
        lane = load.index(min(load))
        load[lane] += seconds
        item.add_marker(pytest.mark.xdist_group(f"early-{lane + 1}"))


@pytest.hookimpl(tryfirst=True)     # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long forms are chosen, never skipped: without ``BERTH_RELIABILITY=long`` they are
    deselected, so a default run reports what it ran and skips nothing. Tests marked ``early``
    go first, the longest first (a stable sort: every xdist worker collects the same order, and
    ``--no-loadscope-reorder`` keeps it, where xdist would put the largest groups first), in
    a few lanes (:func:`_lanes`)."""
    items.sort(key=_early_s, reverse=True)
    if os.environ.get(LONG_ENV) != "long":
        long_ = [it for it in items if it.get_closest_marker(LONG_MARK)]
        if long_:
            config.hook.pytest_deselected(items=long_)
            items[:] = [it for it in items if not it.get_closest_marker(LONG_MARK)]
    _lanes(items)


def _timeout_s(item: pytest.Item) -> float:
    """The pytest-timeout ceiling set for ``item`` (its marker, else the ini's), 0 for none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getini("timeout")
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """pytest-timeout's ceiling bounds a hung test, it does not measure speed: scaled by the
    machine's measured slowness when the test starts (issue 38: a random-sequence property
    test passed pytest-timeout's 300 s with eight busy processes beside the suite)."""
    base = _timeout_s(item)
    if base > 0:
        item.add_marker(pytest.mark.timeout(round(base * slowness(), 1)), append=False)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    result = yield
    check = item.config.stash.get(_CHECK, None)
    if check is None:
        return result
    funcargs = getattr(item, "funcargs", {})
    check.find(funcargs.get("tmp_path"))
    new = check.counted()
    if item.get_closest_marker(EXPECT_OOM) is not None:
        check.expected += sum(n for _, _, n in new)
    elif new:
        lines = [f"{n} simulated OOM on card {name} ({directory})" for directory, name, n in new]
        check.unexpected += [f"{item.nodeid}: {line}" for line in lines]
        raise AssertionError(
            "simulated CUDA OOM during a test that does not expect one (mark it "
            f"@pytest.mark.{EXPECT_OOM} if it makes one on purpose): " + "; ".join(lines))
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    check = session.config.stash.get(_CHECK, None)
    if check is None:
        return
    check.find(None)
    for directory, name, n in check.counted():
        check.unexpected.append(f"after the last test: {n} simulated OOM on card {name} "
                                f"({directory})")
        check.late = True
    if check.late:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    Path(check.registry).unlink(missing_ok=True)
    if hasattr(session.config, "workeroutput"):      # an xdist worker: tell the controller
        session.config.workeroutput["berth_oom"] = {
            "dirs": len(check.dirs), "expected": check.expected,
            "unexpected": check.unexpected, "late": check.late}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist, in the controller: add a worker's OOM figures to the run's."""
    check = node.config.stash.get(_CHECK, None)
    got = getattr(node, "workeroutput", {}).get("berth_oom")
    if check is None or got is None:
        return
    check.from_workers += got["dirs"]
    check.expected += got["expected"]
    check.unexpected += got["unexpected"]
    check.late = check.late or got["late"]


#: Per test marked ``early``: its mark's seconds and the seconds it took (setup, call and
#: teardown), gathered where the reports arrive (the controller under xdist).
_early_took: dict[str, list[float]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    seconds = _early_s(item)
    if seconds >= 0:
        report.user_properties.append((EARLY_MARK, seconds))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    marked = dict(report.user_properties).get(EARLY_MARK)
    if marked is not None:
        took = _early_took.setdefault(report.nodeid, [marked, 0.0])
        took[1] += report.duration


def _early_marks_off() -> list[str]:
    """The ``early`` marks whose seconds are far from what their test took in this run (the
    lanes are balanced by the marks: with an install marked 120 s that took 50, one lane ran
    305 s of tests against another's 190, and the suite waited for it)."""
    return [f"{node}: marked early({marked:g}), took {took:.0f} s"
            for node, (marked, took) in sorted(_early_took.items())
            if took > 1.5 * marked + 5 or took < marked / 1.5 - 5]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    off = _early_marks_off()
    # Only from a run of the whole suite (18 marks): a test run alone is faster than beside it.
    if off and exitstatus == 0 and len(_early_took) >= 15:
        terminalreporter.write_line(
            f"{len(off)} early mark(s) to update to what the test takes (the lanes are "
            f"balanced by them, tests/conftest.py _lanes): " + "; ".join(off))
    check = config.stash.get(_CHECK, None)
    if check is None:
        return
    if check.unexpected:
        terminalreporter.section("simulated OOM not expected by any test", red=True)
        for line in check.unexpected:
            terminalreporter.line(line, red=True)
    terminalreporter.write_line(
        f"simulated OOM: {len(check.dirs) + check.from_workers} card directories read, "
        f"{check.expected} OOM expected (@pytest.mark.{EXPECT_OOM}), "
        f"{len(check.unexpected)} not expected")
