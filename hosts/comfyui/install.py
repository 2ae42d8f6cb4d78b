"""``berth comfyui install COMFYUI_DIR``: Berth into ComfyUI's own Python, the node into its
``custom_nodes/``.

Source: issue 28 ("an install that works": ``berth-gpu`` is not on PyPI yet, the registry entry
is not published, ComfyUI-Manager's Git-URL install takes a repository's root). Steps:

1. ``COMFYUI_DIR`` must be a ComfyUI folder (``main.py`` and ``comfy/``), on Linux (Berth reads
   Linux's ``/proc`` and ``SO_PEERCRED``);
2. ComfyUI's own Python is found from the folder: ``--python``, else ``venv/bin/python``,
   ``.venv/bin/python`` (comfy-cli, the desktop app), ``../python_embeded/python`` (the
   portable layout); it must be Python 3.11 or newer, as Berth is;
3. Berth is installed into it with that Python's pip, from ``--from`` (a Berth checkout or a
   wheel built from one) or else the checkout this ``berth`` runs from (itself always, its
   dependencies only where missing);
4. the node is copied from the Berth now in ComfyUI's Python (so node and library match) to
   ``custom_nodes/berth-comfyui``, replacing an earlier copy of Berth's node (never another
   folder of that name);
5. what was done is printed, with what to do next.

Raises :class:`InstallError` (a message naming the path or value) for anything that stops it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["InstallError", "install", "find_comfyui", "find_python", "berth_source",
           "NODE_FOLDER"]

#: The folder the node gets in ``custom_nodes/``.
NODE_FOLDER = "berth-comfyui"
#: Files of the host package that are not the node (they run in Berth's own process).
_NOT_NODE = ("cli.py", "install.py", "__pycache__", "*.pyc")
_MIN_PYTHON = (3, 11)
_PYTHONS = ("venv/bin/python", ".venv/bin/python", "../python_embeded/python",
            "python_embeded/python")


class InstallError(Exception):
    """Why ``berth comfyui install`` stopped, in words."""


def find_comfyui(path: str | os.PathLike) -> Path:
    """The ComfyUI folder ``path`` (``main.py`` and ``comfy/`` in it), resolved. Raises
    :class:`InstallError`."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise InstallError(f"COMFYUI_DIR: {root} is not a folder")
    if not (root / "main.py").is_file() or not (root / "comfy").is_dir():
        raise InstallError(f"COMFYUI_DIR: {root} has no main.py and comfy/: not a ComfyUI "
                           f"folder (the one with main.py and custom_nodes/)")
    return root


def find_python(root: Path, given: str | None = None) -> Path:
    """ComfyUI's own Python for the ComfyUI folder ``root``: ``given``, else the first of
    :data:`_PYTHONS` that exists. Raises :class:`InstallError` naming the paths tried."""
    if given:
        py = Path(given).expanduser()
        if not py.is_file() or not os.access(py, os.X_OK):
            raise InstallError(f"--python: {py} is not an executable file")
        return py
    for rel in _PYTHONS:
        for py in (root / rel, root / (rel + ".exe")):
            if py.is_file() and os.access(py, os.X_OK):
                return py
    tried = ", ".join(str(root / rel) for rel in _PYTHONS)
    raise InstallError(f"no Python of ComfyUI's own found (tried {tried}); name the one "
                       f"ComfyUI runs with: --python PATH")


def python_version(py: Path) -> tuple[int, int, int]:
    """The version of the Python ``py``. Raises :class:`InstallError` when it does not run."""
    r = _run([str(py), "-c", "import sys; print(*sys.version_info[:3])"])
    try:
        major, minor, micro = (int(x) for x in r.stdout.split())
    except ValueError:
        raise InstallError(f"{py} did not say its version: {r.stdout.strip()!r}") from None
    return major, minor, micro


def berth_source(given: str | None = None) -> Path:
    """What to ``pip install``: ``given`` (a Berth checkout, the folder with its
    pyproject.toml, or a wheel built from one), else the checkout this Berth runs from.
    Raises :class:`InstallError` (a Berth installed from a wheel must name one)."""
    if given:
        src = Path(given).expanduser().resolve()
        if src.is_file() and src.suffix == ".whl":
            return src
        if (src / "pyproject.toml").is_file() and 'name = "berth-gpu"' in \
                (src / "pyproject.toml").read_text():
            return src
        raise InstallError(f"--from: {src} is neither a Berth checkout (its pyproject.toml names "
                           f"berth-gpu) nor a wheel (.whl)")
    import berth
    here = Path(berth.__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file() and (here / "hosts" / "comfyui").is_dir():
        return here
    raise InstallError("this berth is not a checkout, and berth-gpu is not on PyPI yet: name "
                       "a Berth checkout or a wheel built from one with --from PATH")


def _run(cmd: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(f"{cmd[0]}: {e}") from None
    if r.returncode != 0:
        raise InstallError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n"
                           f"{(r.stderr or r.stdout).strip()}")
    return r


def pip_install(py: Path, source: Path) -> list[str]:
    """``source`` into the Python ``py`` with its own pip: Berth itself always (an earlier
    Berth of the same version string is replaced), then its dependencies only where missing,
    so ComfyUI's own torch, aiohttp or pydantic are left as they are. Returns what pip said it
    installed."""
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([str(py), "-m", "pip", "--version"])       # an embedded Python may have no pip
    said = _installed(_run([*pip, "--no-deps", "--force-reinstall", str(source)],
                           timeout_s=900).stdout)
    r = _run([str(py), "-c", "import importlib.metadata as m; print('\\n'.join(r for r in "
              "(m.requires('berth-gpu') or []) if 'extra ==' not in r))"])
    reqs = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    deps = _installed(_run([*pip, *reqs], timeout_s=900).stdout) if reqs else ""
    return [said or "Berth installed", deps or "its dependencies: all there already"]


def _installed(pip_out: str) -> str:
    done = [ln for ln in pip_out.splitlines() if ln.startswith("Successfully installed")]
    return done[-1] if done else ""


def node_source(py: Path) -> Path:
    """The node's folder in the Berth installed in the Python ``py``."""
    r = _run([str(py), "-c", "import importlib.util as u; "
              "print(u.find_spec('berth_hosts.comfyui').submodule_search_locations[0])"])
    return Path(r.stdout.strip().splitlines()[-1])


def copy_node(src: Path, custom_nodes: Path) -> Path:
    """Copy the node from ``src`` to ``custom_nodes/berth-comfyui``: through a new folder and
    renames, replacing only an earlier copy of Berth's node. Returns the folder."""
    custom_nodes.mkdir(exist_ok=True)
    dest = custom_nodes / NODE_FOLDER
    if dest.exists() and not _is_ours(dest):
        raise InstallError(f"{dest} exists and is not Berth's node; move it away first")
    new, old = custom_nodes / f".{NODE_FOLDER}.new", custom_nodes / f".{NODE_FOLDER}.old"
    for p in (new, old):
        shutil.rmtree(p, ignore_errors=True)
    shutil.copytree(src, new, ignore=shutil.ignore_patterns(*_NOT_NODE))
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def _is_ours(folder: Path) -> bool:
    toml = folder / "pyproject.toml"
    return toml.is_file() and 'name = "berth-comfyui"' in toml.read_text()


def install(comfyui_dir: str, python: str | None = None, source: str | None = None,
            say=print) -> Path:
    """The steps of the module's docstring; ``say(line)`` reports each. Returns the node's
    folder. Raises :class:`InstallError`."""
    if not sys.platform.startswith("linux"):
        raise InstallError(f"Berth runs on Linux only (this is {sys.platform})")
    root = find_comfyui(comfyui_dir)
    say(f"ComfyUI: {root}{_comfyui_version(root)}")
    py = find_python(root, python)
    version = python_version(py)
    if version[:2] < _MIN_PYTHON:
        raise InstallError(f"{py} is Python {'.'.join(map(str, version))}; Berth needs "
                           f"{'.'.join(map(str, _MIN_PYTHON))} or newer")
    say(f"ComfyUI's Python: {py} ({'.'.join(map(str, version))})")
    src = berth_source(source)
    dest = root / "custom_nodes" / NODE_FOLDER
    if dest.exists() and not _is_ours(dest):            # before anything is installed
        raise InstallError(f"{dest} exists and is not Berth's node; move it away first")
    say(f"installing Berth from {src} into it (its pip) ...")
    for line in pip_install(py, src):
        say(f"  {line}")
    node = copy_node(node_source(py), root / "custom_nodes")
    say(f"node: copied to {node}")
    say("next: an [engines.comfyui] entry in berth.toml (size, card, growth_allowance; see the "
        "node's README.md), then restart ComfyUI with berthd's environment; its log says "
        "\"Berth: ComfyUI (pid N) registered as lease ...\"")
    return node


def _comfyui_version(root: Path) -> str:
    try:
        for line in (root / "comfyui_version.py").read_text().splitlines():
            if line.startswith("__version__"):
                return f" (version {line.split('=', 1)[1].strip().strip(chr(34))})"
    except OSError:
        pass
    return ""
