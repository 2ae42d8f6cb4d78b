"""``berth`` starts fast: ``berth --help`` and ``berth run --help`` import only what they need
(issue 23 "A CLI that starts fast"), and every subcommand still builds its parser."""

from __future__ import annotations

import subprocess
import sys

import pytest
from berth.cli import build_parser

from tests.berthd import BERTH

#: What a help page must not load: each costs more than Python's own start.
HEAVY = ("aiohttp", "pydantic", "yaml")


def _imported(*args: str) -> set[str]:
    """The modules the ``berth`` script imports for ``args``, as ``-X importtime`` lists them."""
    p = subprocess.run([sys.executable, "-X", "importtime", BERTH, *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("usage: berth"), p.stdout[:200]
    return {line.rpartition("|")[2].strip() for line in p.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_help_imports_no_aiohttp_pydantic_or_yaml(args):
    found = _imported(*args)
    assert "berth.cli" in found                      # the reading is not vacuous
    assert not {m for m in found if m.split(".")[0] in HEAVY}, sorted(
        m for m in found if m.split(".")[0] in HEAVY)


def test_berth_help_imports_no_command_module():
    # berth.startup: the collector's pause at every start (no command's module)
    assert not {m for m in _imported("--help") if m.startswith(("berth.", "berth_hosts."))
                and m not in ("berth.cli", "berth.startup")}


def test_every_command_is_listed_and_builds_its_own_parser():
    from berth.cli import COMMANDS
    listed = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert list(listed) == [c.name for c in COMMANDS]
    for c in COMMANDS:
        p = next(a for a in build_parser([c.name])._actions if a.dest == "command").choices[c.name]
        filled = [a for a in p._actions if a.dest != "help"]
        assert filled, f"{c.builds} added nothing to `berth {c.name}`"
        assert p.get_default("func") or any(a.dest.endswith("command") for a in filled), c.name


def test_a_subcommand_help_is_its_own():
    p = subprocess.run([BERTH, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--front HOST:PORT" in p.stdout and "--require-berthd" in p.stdout
    p = subprocess.run([BERTH, "nosuch"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 'nosuch'" in p.stderr


def test_building_berth_runs_parser_reads_no_entry_point():
    """``berth run --help`` lists the installed adapters (issue 38), but every run builds the
    same parser, before its front listens (issue 30): the registry is read only for the help."""
    code = ("import sys; from berth.cli import build_parser; "
            "build_parser(['run', '--', 'x']).parse_args(['run', '--adapter', 'vllm', '--', 'x']); "
            "print('importlib.metadata' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ["False"], (p.stdout, p.stderr[-2000:])
    helped = subprocess.run([BERTH, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert "installed: llamacpp, ollama, protocol, sglang, vllm" in " ".join(helped.stdout.split())


def test_the_run_becomes_a_subreaper_without_loading_aiohttps_client():
    """``berth run`` becomes a child subreaper (issue 36) before its front listens, which
    llama-swap's first health poll times (250 ms after the start): the call must not load
    aiohttp's client (0.15 s; it lived in ``berth.run.engine`` and the run's start went from
    0.14 s to 0.33 s, bench/llamaswap.py)."""
    code = ("import sys; from berth.run.main import EngineRun; "
            "import inspect, re; src = inspect.getsource(EngineRun.main); "
            "mod = re.search(r'from (berth\\.run\\.\\w+) import become_subreaper', src).group(1); "
            "before = set(sys.modules); __import__(mod); "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('aiohttp.client')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]", p.stdout
