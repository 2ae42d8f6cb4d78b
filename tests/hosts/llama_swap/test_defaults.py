"""wrap's defaults are the product (issue 30): the running berth by its absolute path, a park by
checkpoint when cuda-checkpoint is found (a drain, said in a note, when not), the front answering
llama-swap's health check, and the read paths in ``upstream.ignorePaths``."""

import os
import re
import sys
from pathlib import Path

import pytest
from berth_hosts.llama_swap import WrapError, WrapOptions, wrap_text
from berth_hosts.llama_swap.defaults import (
    LLAMA_SWAP_DEFAULT_IGNORE,
    READ_PATHS,
    READ_PATTERN,
    running_berth,
)

from .conftest import berth_cli, llama_swap_argv, load_yaml, split_run

CONFIG = """\
models:
  a:
    cmd: llama-server --port ${PORT} -m a.gguf
  b:
    cmd: llama-server --port ${PORT} -m b.gguf
"""


@pytest.fixture
def no_tools(tmp_path, monkeypatch):
    """A PATH with no cuda-checkpoint on it, and no $BERTH_CUDA_CHECKPOINT."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("BERTH_CUDA_CHECKPOINT", raising=False)
    return empty


def _tool(directory: Path, name: str = "cuda-checkpoint") -> Path:
    tool = directory / name
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return tool


def test_the_running_berth_is_written_by_its_absolute_path():
    exe = running_berth()
    assert os.path.isabs(exe) and os.access(exe, os.X_OK)
    assert exe == str(Path(sys.executable).parent.absolute() / "berth")
    out, _ = wrap_text(CONFIG, "c.yaml", WrapOptions())
    head, _, _ = split_run(llama_swap_argv(load_yaml(out), "a"))
    assert llama_swap_argv(load_yaml(out), "a")[0] == exe and head[:2] == ["berth", "run"]


def test_without_cuda_checkpoint_models_drain_and_a_note_says_why(no_tools):
    out, report = wrap_text(CONFIG, "c.yaml", WrapOptions())
    for mid in ("a", "b"):
        _, opts, _ = split_run(llama_swap_argv(load_yaml(out), mid))
        assert "--park" not in opts and "--checkpoint-path" not in opts
    assert any("drain" in n and "cuda-checkpoint was not found" in n for n in report.notes)


def test_with_cuda_checkpoint_on_path_models_park_by_checkpoint_with_its_path(no_tools):
    tool = _tool(no_tools)
    out, report = wrap_text(CONFIG, "c.yaml", WrapOptions())
    for mid in ("a", "b"):
        _, opts, _ = split_run(llama_swap_argv(load_yaml(out), mid))
        # written absolute: llama-swap's PATH need not have it
        assert opts["--park"] == ["checkpoint"] and opts["--checkpoint-path"] == [str(tool)]
    assert any("by checkpoint" in n for n in report.notes)


def test_berth_cuda_checkpoint_names_the_tool_and_none_turns_parks_off(no_tools, monkeypatch):
    stand_in = _tool(no_tools, "berth-sim-cuda-checkpoint")
    monkeypatch.setenv("BERTH_CUDA_CHECKPOINT", "berth-sim-cuda-checkpoint")
    out, _ = wrap_text(CONFIG, "c.yaml", WrapOptions())
    _, opts, _ = split_run(llama_swap_argv(load_yaml(out), "a"))
    assert opts["--checkpoint-path"] == [str(stand_in)]
    out, _ = wrap_text(CONFIG, "c.yaml", WrapOptions(park="none"))
    _, opts, _ = split_run(llama_swap_argv(load_yaml(out), "a"))
    assert "--park" not in opts


def test_park_checkpoint_asked_for_but_not_found_is_warned_about(no_tools):
    out, report = wrap_text(CONFIG, "c.yaml", WrapOptions(park="checkpoint"))
    _, opts, _ = split_run(llama_swap_argv(load_yaml(out), "a"))
    assert opts["--park"] == ["checkpoint"]
    assert any("was not found" in w and "refuses to start" in w for w in report.warnings)


def test_every_run_line_has_front_health_and_keep_front():
    out, _ = wrap_text(CONFIG, "c.yaml", WrapOptions())
    for mid in ("a", "b"):
        _, opts, _ = split_run(llama_swap_argv(load_yaml(out), mid))
        assert "--front-health" in opts and "--keep-front" in opts


def test_read_paths_are_ignored_and_llama_swaps_default_pattern_is_kept():
    out, report = wrap_text(CONFIG, "c.yaml", WrapOptions())
    paths = load_yaml(out)["upstream"]["ignorePaths"]
    assert paths == [LLAMA_SWAP_DEFAULT_IGNORE, READ_PATTERN]
    for p in READ_PATHS:
        assert re.search(READ_PATTERN, p) and re.search(READ_PATTERN, p + "/"), p
    for p in ("/", "/v1/chat/completions", "/models/load", "/models/unload", "/completion"):
        assert not any(re.search(x, p) for x in paths), p
    assert any("upstream.ignorePaths" in n for n in report.notes)
    again, report = wrap_text(out, "c.yaml", WrapOptions())
    assert load_yaml(again)["upstream"] == load_yaml(out)["upstream"]
    assert not any("ignorePaths" in n for n in report.notes)


def test_the_users_ignore_paths_are_kept_and_a_wrong_type_is_refused():
    out, _ = wrap_text(CONFIG + "upstream:\n  ignorePaths: ['^/internal/']\n", "c.yaml")
    assert load_yaml(out)["upstream"]["ignorePaths"] == ["^/internal/", READ_PATTERN]
    with pytest.raises(WrapError, match="upstream.ignorePaths"):
        wrap_text(CONFIG + "upstream:\n  ignorePaths: '^/x'\n", "c.yaml")
    with pytest.raises(WrapError, match="upstream:"):
        wrap_text(CONFIG + "upstream: 3\n", "c.yaml")


def test_the_command_says_what_it_chose(no_tools, tmp_path):
    src = tmp_path / "c.yaml"
    src.write_text(CONFIG)
    r = berth_cli("llama-swap", "wrap", str(src))
    assert r.returncode == 0, r.stderr
    assert "note: park: none, so models drain" in r.stderr
    assert "note: upstream.ignorePaths: added" in r.stderr
    assert load_yaml(r.stdout)["models"]["a"]["cmd"].startswith(running_berth() + " run ")
