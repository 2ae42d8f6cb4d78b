"""Helpers for the llama-swap host tests: the example configs, and an independent reading of a
``cmd`` the way llama-swap (``0bdb372``) reads it, split with Python's :func:`shlex.split`."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import berth_hosts.llama_swap
import pytest
import yaml

from tests.real.fixtures import real_swap, real_tools  # noqa: F401  (the real-program fixtures)

EXAMPLES = sorted((Path(berth_hosts.llama_swap.__file__).parent / "examples").glob("*.yaml"))


def _go_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def llama_swap_argv(doc: dict, model_id: str) -> list[str]:
    """The argv llama-swap execs for ``models[model_id].cmd``: comment lines dropped, macros
    expanded (the model's own replacing globals, last declared first, ``MODEL_ID`` last),
    ``${PORT}`` left as it is, backslash lines joined, then a POSIX split."""
    model = doc["models"][model_id]
    merged = [("MODEL_ID", model_id), *(doc.get("macros") or {}).items()]
    for name, value in (model.get("macros") or {}).items():
        names = [n for n, _ in merged]
        if name in names:
            merged[names.index(name)] = (name, value)
        else:
            merged.append((name, value))
    text = "\n".join(line for line in model["cmd"].split("\n")
                     if not line.strip().startswith("#"))
    for name, value in reversed(merged):
        text = text.replace("${%s}" % name, _go_text(value))
    lines = []
    for line in text.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith("#"):
            continue
        lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    return shlex.split("\n".join(lines))


#: ``berth run`` flags that take no value.
RUN_SWITCHES = ("--front-health", "--keep-front")


def split_run(argv: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """``berth run`` argv -> (the first six words, its options, the engine's argv); a switch
    (:data:`RUN_SWITCHES`) maps to ``[""]``; the first word is the executable's base name."""
    end = argv.index("--")
    opts: dict[str, list[str]] = {}
    words = [w for w in argv[6:end] if w not in RUN_SWITCHES]
    for w in argv[6:end]:
        if w in RUN_SWITCHES:
            opts[w] = [""]
    for flag, value in zip(words[::2], words[1::2], strict=False):
        opts.setdefault(flag, []).append(value)
    assert len(words) % 2 == 0, words
    return [os.path.basename(argv[0]), *argv[1:6]], opts, argv[end + 1:]


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request) -> Path:
    return request.param


def load_yaml(text: str) -> dict:
    return yaml.safe_load(text)


def llama_swap_env(text: str, environ: dict[str, str]) -> str:
    """llama-swap's first step at load (``internal/config/macros.go``, ``substituteEnvMacros``):
    every ``${env.NAME}`` in the YAML *text* is replaced by the variable's value, ``\\`` and
    ``"`` escaped for a double-quoted scalar, before the text is parsed."""
    def value(match):
        return environ[match.group(1)].replace("\\", "\\\\").replace('"', '\\"')
    return re.sub(r"\$\{env\.([a-zA-Z_][a-zA-Z0-9_]*)\}", value, text)


def berth_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``berth ARGS…`` run as its own process, as a user runs it."""
    exe = Path(sys.executable).with_name("berth")
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                          timeout=60)
