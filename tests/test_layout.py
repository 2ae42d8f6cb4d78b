"""The folders are the architecture (issue 11): imports go one way, and no module, class or
function grows past what a reader takes in at once (600, 300 and 60 lines: split along its jobs;
issue 23: a limit on functions, so a class cannot pass by being split into a chain of bases).

Import direction, read from the source with :mod:`ast` (imports inside functions count too):

- ``berth.decide`` imports nothing else of Berth, and of the standard library only modules that
  do no I/O and read no clock (:data:`PURE_STDLIB`); nothing from outside it;
- ``berth.driver`` imports only ``berth.decide`` of Berth (the driver over simulated cards is
  part of the simulation kit, ``berth.sim.driver``, beside the cards it reads);
- ``berth.daemon`` (berthd) and ``berth.run`` (``berth run``) do not import each other;
- ``berth_plugins`` imports no host (a host's plugin comes through the entry-point group);
- a host (``berth_hosts.X``) imports ``berth`` and ``berth_plugins`` and itself, no other host,
  and not berthd's own room ``berth.daemon``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

# One worker reads every module once (the parse is cached per process): spread over the
# workers, each test parsed all 250 modules again, 15 s a test on a loaded two-core machine.
pytestmark = pytest.mark.xdist_group("layout")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"berth": ROOT / "core", "berth_plugins": ROOT / "berth_plugins",
            "berth_hosts": ROOT / "hosts"}
#: The standard library berth.decide may use: no I/O, no clock, no logging, no randomness.
PURE_STDLIB = {"__future__", "abc", "bisect", "collections", "dataclasses", "enum", "functools",
               "heapq", "itertools", "math", "operator", "re", "statistics", "string", "typing",
               "types"}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    """Every module of the three packages, by its dotted name."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([top, *parts])] = path
    return out


MODULES = _modules()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """``path`` parsed, once per process (the tests here read the same 250 modules)."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def _imports(name: str, path: Path) -> frozenset[str]:
    """The absolute names ``name`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
    return frozenset(out)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _ours(name: str) -> bool:
    return any(_under(name, top) for top in PACKAGES)


def _breaches(rule) -> list[str]:
    """``module -> import`` for every import ``rule(module, import)`` refuses."""
    return [f"{m} -> {i}" for m, path in MODULES.items() for i in sorted(_imports(m, path))
            if not rule(m, i)]


def test_the_module_list_is_the_tree():
    assert "berth.decide.ledger" in MODULES and "berth.daemon.broker" in MODULES
    assert "berth_plugins.manager" in MODULES and "berth_hosts.supervisor.plugin" in MODULES
    # A relative import resolves within its package.
    assert "berth_plugins.hookspecs" in _imports("berth_plugins.manager",
                                                 MODULES["berth_plugins.manager"])


def test_decide_imports_nothing_else_of_berth_and_nothing_that_does_io():
    def rule(m, i):
        if not _under(m, "berth.decide"):
            return True
        return _under(i, "berth.decide") or i.split(".")[0] in PURE_STDLIB
    assert _breaches(rule) == []


def test_the_driver_imports_only_decide_of_berth():
    def rule(m, i):
        if not _under(m, "berth.driver") or not _ours(i):
            return True
        return (_under(i, "berth.decide") or _under(i, "berth.driver")
                or i == "berth")
    assert _breaches(rule) == []


def test_the_daemon_and_the_run_do_not_import_each_other():
    def rule(m, i):
        if _under(m, "berth.daemon"):
            return not _under(i, "berth.run")
        if _under(m, "berth.run"):
            return not _under(i, "berth.daemon")
        return True
    assert _breaches(rule) == []


def test_plugins_import_no_host():
    assert _breaches(lambda m, i: not (_under(m, "berth_plugins")
                                       and _under(i, "berth_hosts"))) == []
    from berth_plugins.adapters import entry_points
    from berth_plugins.manager import BUILTINS  # imported by name, not by statement
    assert not [b for b in BUILTINS if not _under(b, "berth_plugins")]
    own = [ep.value for ep in entry_points(own_only=True)]      # Berth's own adapters, likewise
    assert own and not [m for m in own if not _under(m, "berth_plugins")]


def test_hosts_import_berth_and_berth_plugins_only():
    def rule(m, i):
        if not _under(m, "berth_hosts") or not _ours(i) or m == "berth_hosts":
            return True
        own = ".".join(m.split(".")[:2])
        if _under(i, "berth_hosts"):
            return _under(i, own) or i == "berth_hosts"
        return not _under(i, "berth.daemon")
    assert _breaches(rule) == []


def test_imports_are_read_wherever_they_are(tmp_path):
    """The reading is not vacuous: absolute, relative and function-level imports are all seen."""
    probe = tmp_path / "probe.py"
    probe.write_text("from berth.run.main import x\nimport berth.decide.ledger\n"
                     "def f():\n    from ..run import y\n")
    found = _imports("berth.daemon.probe", probe)
    assert {"berth.run.main", "berth.decide.ledger", "berth.run", "berth.run.y"} <= found



@functools.cache
def _sizes() -> tuple[list[tuple[int, str]], list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, module), (lines, module:Class) and (lines, module:function), largest first. A
    function's lines run from its ``def`` to its last line, docstring included, decorators
    not; a method is named ``module:Class.method``, a nested function by its path too."""
    mods, classes, funcs = [], [], []
    for name, path in MODULES.items():
        mods.append((len(path.read_text(encoding="utf-8").splitlines()), name))
        for node, qual in _named(_tree(path)):
            lines = node.end_lineno - node.lineno + 1
            if isinstance(node, ast.ClassDef):
                classes.append((lines, f"{name}:{qual}"))
            else:
                funcs.append((lines, f"{name}:{qual}"))
    return sorted(mods, reverse=True), sorted(classes, reverse=True), sorted(funcs, reverse=True)


def _named(tree: ast.AST, prefix: str = ""):
    """Yield ``(node, qualified name)`` for every class and function under ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            qual = f"{prefix}{node.name}"
            yield node, qual
            yield from _named(node, qual + ".")
        else:
            yield from _named(node, prefix)


def test_no_module_over_600_lines_and_no_class_over_300():
    mods, classes, _ = _sizes()
    over = ([f"module {n} ({lines} lines)" for lines, n in mods if lines > MAX_MODULE_LINES]
            + [f"class {n} ({lines} lines)" for lines, n in classes if lines > MAX_CLASS_LINES])
    assert over == [], "split along its jobs: " + "; ".join(over)


def test_no_function_over_60_lines():
    over = [f"{n} ({lines} lines)" for lines, n in _sizes()[2] if lines > MAX_FUNCTION_LINES]
    assert over == [], "split along its jobs, not at line 60: " + "; ".join(over)


def test_the_function_sizes_are_read_wherever_they_are(tmp_path):
    """Methods and nested functions are measured, each under its own name."""
    body = "\n".join(f"            x{i} = {i}" for i in range(61))
    probe = tmp_path / "probe.py"
    probe.write_text(f"class A:\n    def m(self):\n        def inner():\n{body}\n"
                     f"        return inner\n")
    found = {q: n.end_lineno - n.lineno + 1 for n, q in _named(ast.parse(probe.read_text()))}
    assert found["A.m.inner"] == 62 and found["A.m"] == 64 and found["A"] == 65


def test_every_package_folder_is_in_the_distribution():
    """pyproject.toml names each package (a folder missing there is missing from a wheel)."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {m for m, path in MODULES.items() if path.name == "__init__.py"}
    assert folders == listed, (sorted(folders - listed), sorted(listed - folders))


# -- no import circle (issue 38) ------------------------------------------------------------------

def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST):
    """Every import statement under ``tree`` that runs (module or function level), the bodies
    of ``if TYPE_CHECKING:`` aside."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _edges(name: str, path: Path, modules=MODULES) -> set[str]:
    """The modules of ours that ``name`` imports when it runs: ``from a import b`` is ``a.b``
    when that is a module, else ``a``; ``import a.b.c`` is the longest of it that is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_imports(_tree(path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                found = [".".join(parts[:i]) for i in range(len(parts), 0, -1)
                         if ".".join(parts[:i]) in modules]
                out.update(found[:1])
            continue
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        for a in node.names:
            if f"{mod}.{a.name}" in modules:
                out.add(f"{mod}.{a.name}")
            elif mod in modules:
                out.add(mod)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) per strongly connected group of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:                     # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, g) for g in groups]


def _one_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path through ``group`` from its first module back to it (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError(f"no cycle through {sorted(group)}")


def test_no_import_circle():
    """A circle works only by the order its modules happen to load in, and no part of it can be
    read or tested alone: put what both sides need in a leaf module, or make one module of two
    that are one idea. Imports under ``if TYPE_CHECKING:`` do not run and do not count."""
    graph = {m: _edges(m, path) for m, path in MODULES.items()}
    cycles = _cycles(graph)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_circle_reading_is_not_vacuous(tmp_path):
    """Function-level imports count, TYPE_CHECKING ones do not, and a circle is named."""
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("def f():\n    from pkg import b\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                 "else:\n    import pkg.a.x\n")
    c.write_text("from . import b\n")
    modules = {"pkg.a": a, "pkg.b": b, "pkg.c": c}
    graph = {m: _edges(m, p, modules) for m, p in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert _cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
