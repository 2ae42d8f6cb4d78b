"""An error about a key or password names the key path and what is wrong, never the value
(review finding: `board.key: String should have at least 16 characters (got 'short')` wrote
the secret back, into berthd's log too)."""

from __future__ import annotations

import subprocess

from tests.berthd import BERTH


def test_a_short_key_is_refused_without_repeating_it(tmp_path):
    cfg = tmp_path / "berth.toml"
    cfg.write_text('[board]\nkey = "hunter2-secret"\n[network]\nkey = "tiny"\n'
                   '[hosts.supervisor]\npassword = 7\n')
    out = subprocess.run([BERTH, "config", "check", str(cfg)], capture_output=True, text=True,
                         timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert "hunter2" not in said and "tiny" not in said, said
    assert "board.key: must be at least 16 characters (got 14 characters)" in said, said
    assert "network.key: must be at least 16 characters (got 4 characters)" in said, said
    assert "hosts.supervisor.password:" in said, said
