"""An adapter in a package of its own, installed with pip, is usable with no file of Berth
changed (issue 38): ``berth config check`` and ``berth run --park hook --adapter NAME`` accept
it and ``berth run --help`` lists it.

The package is CONTRIBUTING.md's worked example ("Add an adapter"), read from that file, so the
guide stays true. It is built offline (no build isolation: setuptools is in the test extra) and
installed by pip into a venv layered on the test's own: that venv sees every package of the
test's (a ``.pth`` adds its site-packages), and the install stays out of the venv that the rest
of the suite, running in parallel, shares (a plugin manager there reading a half-written or
half-removed package would refuse to start).
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "CONTRIBUTING.md"
PACKAGE = "berth-adapter-sleepy"
NAME = "sleepy"


def example_files() -> dict[str, str]:
    """CONTRIBUTING.md's files of the example package: a line `` `berth-adapter-sleepy/PATH`: ``
    then a fenced block holding the file."""
    text = GUIDE.read_text(encoding="utf-8")
    found = dict(re.findall(rf"^`{PACKAGE}/([^`]+)`:\n\n```\w*\n(.*?)^```$", text, re.M | re.S))
    assert set(found) == {"pyproject.toml", "berth_adapter_sleepy.py"}, sorted(found)
    return found


@pytest.fixture
def python(tmp_path) -> Path:
    """The interpreter of a new venv (no pip of its own) layered on the test's venv."""
    root = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(root)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    assert site.is_dir(), sorted(p.name for p in (root / "lib").iterdir())
    # addsitedir, not a bare path: the test venv's own .pth files (the editable install of
    # Berth) are read too.
    (site / "layered.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return root / "bin" / "python"


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "--no-input",
                           *args], capture_output=True, text=True, timeout=300)


def _berth(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "berth.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def installed(tmp_path, python) -> Path:
    """``python`` with the example package pip-installed (from its folder, offline)."""
    src = tmp_path / PACKAGE
    src.mkdir()
    for rel, body in example_files().items():
        (src / rel).write_text(body)
    r = _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src))
    assert r.returncode == 0, r.stdout + r.stderr
    return python


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "berth.toml"
    cfg.write_text(f'[engines.e]\nfront = "127.0.0.1:9000"\npark = "hook"\n'
                   f'adapter = "{NAME}"\n')
    return cfg


def _run_flags(adapter: str) -> list[str]:
    # `--option x` (no KEY=VALUE) is checked after the adapter: a run that gets that far
    # accepted the adapter, and stops before anything starts.
    return ["run", "--engine", "e", "--front", "127.0.0.1:9", "--park", "hook", "--adapter",
            adapter, "--option", "x", "--", "engine", "--port", "{port}"]


def test_an_adapter_package_installed_with_pip_is_accepted_and_listed(tmp_path, installed):
    r = _berth(installed, "config", "check", str(_config(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _berth(installed, *_run_flags(NAME))
    assert r.returncode == 2 and "--option: expected KEY=VALUE" in r.stderr, r.stderr
    assert "--adapter" not in r.stderr, r.stderr
    r = _berth(installed, "run", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())      # argparse wraps the help
    assert re.search(rf"installed: [^()]*\b{NAME}\b", text), r.stdout
    r = _pip(installed, "uninstall", "-q", "-y", PACKAGE)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _berth(installed, "config", "check", str(_config(tmp_path)))
    assert r.returncode != 0 and f"no plugin carries out adapter '{NAME}'" in r.stderr, r.stderr


def test_without_the_package_the_same_name_is_refused(tmp_path, python):
    """The control: nothing of Berth knows the name until the package is installed."""
    r = _berth(python, "config", "check", str(_config(tmp_path)))
    assert r.returncode != 0 and f"no plugin carries out adapter '{NAME}'" in r.stderr, r.stderr
    r = _berth(python, *_run_flags(NAME))
    assert r.returncode == 2 and f"--adapter: no plugin carries out '{NAME}'" in r.stderr
    assert "known adapters: llamacpp, ollama, protocol, sglang, vllm" in r.stderr, r.stderr
    assert not re.search(rf"\b{NAME}\b", _berth(python, "run", "--help").stdout)
