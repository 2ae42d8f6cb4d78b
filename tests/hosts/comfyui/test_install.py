"""``berth comfyui install COMFYUI_DIR`` on a minimal ComfyUI layout with its own venv (issue 28):
Berth lands in ComfyUI's Python from this checkout, the node in ``custom_nodes/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.berthd import BERTH


def _layout(tmp: Path) -> Path:
    root = tmp / "ComfyUI"
    (root / "comfy").mkdir(parents=True)
    (root / "custom_nodes").mkdir()
    (root / "main.py").write_text("# ComfyUI's entry point\n")
    (root / "comfyui_version.py").write_text('__version__ = "0.3.64"\n')
    return root


def _install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "comfyui", "install", *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.early(75)
def test_install_into_a_comfyui_with_its_own_venv(tmp_path):
    root = _layout(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    r = _install(str(root))
    assert r.returncode == 0, r.stderr
    py = root / "venv" / "bin" / "python"
    assert f"ComfyUI: {root} (version 0.3.64)" in r.stdout
    assert f"ComfyUI's Python: {py} (3." in r.stdout
    assert "berth-gpu" in r.stdout and "node: copied to" in r.stdout
    node = root / "custom_nodes" / "berth-comfyui"
    assert (node / "agent.py").is_file() and (node / "gate.py").is_file()
    assert not (node / "cli.py").exists() and not (node / "install.py").exists()
    # ComfyUI's Python has Berth, and loads the node as ComfyUI does (from its file path).
    check = subprocess.run([str(py), "-c", (
        "import importlib.util, sys, berth.client\n"
        f"spec = importlib.util.spec_from_file_location('berth_comfyui', {str(node / '__init__.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['berth_comfyui'] = m\n"
        "spec.loader.exec_module(m); print(sorted(m.NODE_CLASS_MAPPINGS))")],
        capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "['BerthStatus']"



def test_a_second_copy_replaces_berths_node_and_nothing_else(tmp_path):
    from berth_hosts.comfyui.install import copy_node

    from tests.hosts.comfyui.conftest import NODE_DIR
    nodes = tmp_path / "custom_nodes"
    node = copy_node(NODE_DIR, nodes)
    (node / "stale.py").write_text("")
    (nodes / "other-node").mkdir()
    assert copy_node(NODE_DIR, nodes) == node
    assert not (node / "stale.py").exists() and (node / "gate.py").is_file()
    assert (nodes / "other-node").is_dir()
    assert sorted(p.name for p in nodes.iterdir()) == ["berth-comfyui", "other-node"]


def test_refusals_name_the_path_and_the_value(tmp_path):
    r = _install(str(tmp_path))
    assert r.returncode == 2 and "not a ComfyUI folder" in r.stderr and "Traceback" not in r.stderr
    root = _layout(tmp_path)
    r = _install(str(root))
    assert r.returncode == 2 and "--python PATH" in r.stderr and str(root / "venv") in r.stderr
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 3 10 12\n")
    old.chmod(0o755)
    r = _install(str(root), "--python", str(old))
    assert r.returncode == 2 and "Python 3.10.12; Berth needs 3.11 or newer" in r.stderr
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").symlink_to(sys.executable)
    r = _install(str(root), "--from", str(tmp_path))
    assert r.returncode == 2 and "neither a Berth checkout" in r.stderr
    (root / "custom_nodes" / "berth-comfyui").mkdir()          # someone else's folder
    r = _install(str(root))
    assert r.returncode == 2 and "is not Berth's node; move it away" in r.stderr
