"""Where the simulation kit's short processes (the stand-in cuda-checkpoint, the stub engine)
find the simulated cards: from the two keys of berth.toml that name them, without the schema,
whose import cost each of them more CPU than its own work (issue 38, the suite's time)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from berth import paths
from berth.config import ConfigError

_PROBE = ("import sys; from berth import paths; print(paths.client_sim_dir()); "
          "print('pydantic' in sys.modules)")


def _probe(cfg) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "BERTH_SIM_DIR"}
    env["BERTH_CONFIG"] = str(cfg)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.split()


def test_the_cards_are_found_without_loading_the_schema(tmp_path):
    cfg = tmp_path / "berth.toml"
    cfg.write_text(f'[driver]\nkind = "sim"\nsim_dir = "{tmp_path / "cards"}"\n')
    assert _probe(cfg) == [str(tmp_path / "cards"), "False"]


def test_the_state_dir_names_them_when_sim_dir_does_not(tmp_path, monkeypatch):
    monkeypatch.delenv("BERTH_SIM_DIR", raising=False)
    cfg = tmp_path / "berth.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n[driver]\nkind = "sim"\n')
    monkeypatch.setenv("BERTH_CONFIG", str(cfg))
    assert paths.client_sim_dir() == tmp_path / "state" / "sim"


@pytest.mark.parametrize("text, key", [
    ("state_dir = 3\n", "state_dir"),
    ('[driver]\nsim_dir = ["a"]\n', "driver.sim_dir"),
    ("[driver\n", "(toml)"),
])
def test_a_malformed_key_that_names_them_gets_the_schemas_error(tmp_path, monkeypatch, text, key):
    monkeypatch.delenv("BERTH_SIM_DIR", raising=False)
    cfg = tmp_path / "berth.toml"
    cfg.write_text(text)
    monkeypatch.setenv("BERTH_CONFIG", str(cfg))
    with pytest.raises(ConfigError) as e:
        paths.client_sim_dir()
    assert key in str(e.value)
