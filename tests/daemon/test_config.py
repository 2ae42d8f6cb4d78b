"""berth.toml: the example validates; bad configs list every error by key path and value."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from berth.config import ConfigError, load, parse
from tests.berthd import BERTH

EXAMPLE = Path(__file__).resolve().parents[2] / "core" / "examples" / "berth.toml"


def test_the_commented_example_config_validates():
    cfg = load(EXAMPLE)
    assert cfg.driver.kind == "sim" and len(cfg.driver.cards) == 2
    assert cfg.card_config("0000:01:00.0", "gpu0").claims == {"desktop": 1 << 30}
    out = subprocess.run([BERTH, "config", "check", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0 and "valid" in out.stdout and "qwen-14b" in out.stdout


def test_every_error_is_listed_with_its_key_and_value():
    with pytest.raises(ConfigError) as e:
        parse({"driver": {"kind": "sim", "cards": [{"pci": "nope", "name": "g", "total": "x"}]},
               "policy": {"release_grace": "soon", "queue": "fifo"},
               "engines": {"c": {"park": "checkpoint"}, "d": {"park": "hook"}}})
    keys = [k for k, _ in e.value.problems]
    assert keys == ["driver.cards.0.pci", "driver.cards.0.total", "policy.queue",
                    "policy.release_grace", "engines.c", "engines.d"]
    text = str(e.value)
    assert "'nope'" in text and "'soon'" in text and "front" in text


def test_a_missing_or_malformed_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[driver\nkind=")
    with pytest.raises(ConfigError, match=r"\(toml\)"):
        load(bad)


def test_card_entries_must_name_a_declared_sim_card():
    with pytest.raises(ConfigError, match="cards.gpu7"):
        parse({"driver": {"kind": "sim", "cards": [{"pci": "0000:01:00.0", "name": "gpu0",
                                                     "total": "8GiB"}]},
               "cards": {"gpu7": {"reserve": "1GiB"}}})


def test_tcp_api_needs_a_key():
    with pytest.raises(ConfigError, match="api"):
        parse({"api": {"tcp": "127.0.0.1:7878"}})
