"""``berth llama-swap wrap`` as a command: stdout or ``-o``, stdin, exit statuses, and the
README's berth.toml entries (they must be entries berthd accepts)."""

import re
import sys
import tomllib
from pathlib import Path

import berth_hosts.llama_swap
from berth.cli import main
from berth.config import parse

from .conftest import EXAMPLES, llama_swap_argv, load_yaml

README = Path(berth_hosts.llama_swap.__file__).parent / "README.md"


def test_wrap_prints_the_config_and_reports_on_stderr(capsys):
    path = next(p for p in EXAMPLES if p.stem == "llamacpp-pair")
    assert main(["llama-swap", "wrap", str(path)]) == 0
    out, err = capsys.readouterr()
    doc = load_yaml(out)
    # llama-swap runs no shell: the berth written is this one, by its absolute path (issue 30)
    berth = str(Path(sys.executable).parent.absolute() / "berth")
    assert llama_swap_argv(doc, "nomic-embed")[:2] == [berth, "run"]
    assert "warning: healthCheckTimeout: 120 s raised to 300 s" in err
    assert "wrapped 3 model(s)" in err


def test_wrap_writes_out_and_reads_stdin(tmp_path, monkeypatch, capsys):
    path = next(p for p in EXAMPLES if p.stem == "multiline")
    out_file = tmp_path / "wrapped.yaml"
    assert main(["llama-swap", "wrap", str(path), "-o", str(out_file), "-q",
                 "--berth", "/opt/berth/bin/berth", "--health-check-timeout", "900"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "note:" not in err and "warning:" in err
    doc = load_yaml(out_file.read_text())
    assert doc["healthCheckTimeout"] == 900
    assert llama_swap_argv(doc, "phi-4-mini")[:2] == ["/opt/berth/bin/berth", "run"]
    monkeypatch.setattr("sys.stdin", open(out_file))
    assert main(["llama-swap", "wrap", "-"]) == 0
    again, err = capsys.readouterr()
    assert load_yaml(again) == doc and "already wrapped" in err


def test_errors_exit_2_with_one_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  a:\n    cmd: /app/sd-server --listen-port 9999\n")
    assert main(["llama-swap", "wrap", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "models.a.proxy" in err
    assert main(["llama-swap", "wrap", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    toml = tmp_path / "berth.toml"
    toml.write_text('[engines.a]\nsize = "lots"\n')
    assert main(["llama-swap", "wrap", str(bad), "--size-from", str(toml)]) == 2
    assert "--size-from" in capsys.readouterr().err
    assert main(["llama-swap"]) == 2


def test_readme_berth_toml_entries_are_valid_and_name_example_models():
    block = re.search(r"```toml\n(.*?)```", README.read_text(), re.S).group(1)
    cfg = parse(tomllib.loads(block), "README.md")
    models = set()
    for path in EXAMPLES:
        models |= set(load_yaml(path.read_text())["models"])
    assert cfg.engines and set(cfg.engines) <= models


def test_a_model_id_with_a_space_is_warned_about_with_its_engine_name(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('models:\n  "Qwen 7B":\n    cmd: llama-server --port ${PORT}\n'
                   '  Qwen/Qwen2.5-7B:\n    cmd: llama-server --port ${PORT}\n')
    assert main(["llama-swap", "wrap", str(cfg)]) == 0
    out, err = capsys.readouterr()
    warned = [line for line in err.splitlines() if "engine name" in line]
    assert len(warned) == 1 and "warning: models.Qwen 7B:" in warned[0]
    assert "--engine Qwen-7B" in warned[0] and '[engines."Qwen-7B"]' in warned[0]
    assert llama_swap_argv(load_yaml(out), "Qwen/Qwen2.5-7B")[3] == "Qwen/Qwen2.5-7B"


def test_a_config_that_is_not_utf8_text_is_named_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "config.yaml"
    bad.write_bytes(b"models:\n  a:\n    cmd: \xd0\x28 --port ${PORT}\n")
    assert main(["llama-swap", "wrap", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not UTF-8 text" in err and "byte 0xd0" in err, err


def test_a_negative_health_check_timeout_is_refused(capsys):
    path = next(p for p in EXAMPLES if p.stem == "multiline")
    assert main(["llama-swap", "wrap", str(path), "--health-check-timeout", "-5"]) == 2
    err = capsys.readouterr().err
    assert "--health-check-timeout: must be at least 1 second, got -5" in err, err


def test_models_the_berth_toml_has_no_entry_for_are_warned_about(tmp_path, monkeypatch, capsys):
    # Review finding: wrapped without sizes and without entries, every request to the model
    # was llama-swap's 500 "upstream command exited prematurely", with only a note at wrap time.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models:\n  ma:\n    cmd: llama-server --port ${PORT}\n"
                   "  mb:\n    cmd: llama-server --port ${PORT}\n")
    toml = tmp_path / "berth.toml"
    toml.write_text('[engines.ma]\nsize = "6GiB"\n')
    monkeypatch.setenv("BERTH_CONFIG", str(toml))
    assert main(["llama-swap", "wrap", str(cfg), "-q"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "entry for" in line]
    assert len(warned) == 1 and "warning:" in warned[0], warned
    assert f"{toml} has no" in warned[0] and "entry for mb:" in warned[0], warned
    toml.write_text('[engines.ma]\nsize = "6GiB"\n[engines.mb]\nsize = "6GiB"\n')
    assert main(["llama-swap", "wrap", str(cfg), "-q"]) == 0
    assert "entry for" not in capsys.readouterr().err
    monkeypatch.setenv("BERTH_CONFIG", str(tmp_path / "none.toml"))
    assert main(["llama-swap", "wrap", str(cfg), "-q"]) == 0
    assert f"there is no {tmp_path / 'none.toml'}" in capsys.readouterr().err


def test_wrap_onto_its_own_source_is_refused_and_the_source_kept(tmp_path, capsys):
    """``-o config.yaml`` for ``config.yaml`` (a new user's find) replaced the source with the
    wrapped config, exit 0: its YAML comments were gone, and the header's advice (edit the
    source and wrap it again) had no source left to follow. It exits 2 naming -o and the path,
    the source untouched, whichever spelling of the path names it."""
    src = tmp_path / "config.yaml"
    text = "# my models\nmodels:\n  a:\n    cmd: llama-server --port ${PORT}  # the 7B\n"
    src.write_text(text)
    link = tmp_path / "link.yaml"
    link.symlink_to(src)
    for out in (str(src), str(tmp_path / "." / "config.yaml"), str(link)):
        assert main(["llama-swap", "wrap", str(src), "-o", out]) == 2
        stdout, err = capsys.readouterr()
        assert stdout == "" and f"-o {out}" in err and "config.berth.yaml" in err, err
        assert src.read_text() == text
