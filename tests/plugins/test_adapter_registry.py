"""The adapters' registry is the one list (issue 38): Berth's own adapters are the entry points
of ``berth.adapters`` in its pyproject.toml, the installed metadata says the same, the guide's
table lists the same, and no code of core/ or hosts/ names one."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from berth_plugins import adapters as registry

ROOT = Path(__file__).resolve().parents[2]


def own_adapters() -> dict[str, str]:
    """Berth's own adapters, name -> module, from its pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"][registry.GROUP]


def test_the_installed_metadata_is_the_pyprojects():
    """An install older than pyproject.toml would leave adapters unregistered: reinstall
    (``pip install -e '.[test]'``) when this fails."""
    installed = {ep.name: ep.value for ep in registry.entry_points(own_only=True)}
    assert installed == own_adapters(), "reinstall: pip install -e '.[test]'"
    assert set(own_adapters()) <= set(registry.names())


def test_the_guides_table_lists_the_registry():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    table = text.split("### The adapters Berth ships", 1)[1]
    rows = re.findall(r"^\| `([a-z0-9_-]+)` \|", table, re.M)
    assert sorted(rows) == sorted(own_adapters())


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def naming(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of each string in ``source`` (docstrings aside: they may cite an
    engine) that names an adapter: is one, quotes one, or lists two or more."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    words = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        s = node.value
        quoted = any(f"{q}{n}{q}" in s for n in names for q in "'\"`")
        if s in names or quoted or len(set(words.findall(s))) >= 2:
            out.append((node.lineno, s))
    return out


def test_core_and_hosts_name_no_adapter():
    """Adding an adapter touches no file of core/ or hosts/. The simulation kit (core/sim) is
    left out: its stand-ins imitate the engines themselves (``berth sim ollama`` is Ollama's
    server, not the adapter), whose names the adapters share."""
    names = set(own_adapters())
    found = []
    for folder in ("core", "hosts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / "core" / "sim"):
                continue
            for line, text in naming(path.read_text(encoding="utf-8"), names):
                found.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert found == [], "read the registry (berth_plugins.adapters) instead:\n" + "\n".join(found)


def test_the_reading_is_not_vacuous():
    probe = '''"""vllm and sglang in a docstring are fine."""
x = "protocol"
y = f"lend uses 'protocol', which..."
z = "protocol, vllm, sglang"
w = "an asyncio protocol"
'''
    assert sorted(line for line, _ in naming(probe, set(own_adapters()))) == [2, 3, 4]
