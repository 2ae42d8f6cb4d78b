"""An error about a key or password names the key path and what is wrong, never the value
(review finding: `board.key: String should have at least 16 characters (got 'short')` wrote
the secret back, into berthd's log too)."""

from __future__ import annotations

import subprocess

import pytest

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


SECRET = "hunter2-correct-horse-battery"


@pytest.mark.parametrize("text,where", [
    (f'[board]\nkye = "{SECRET}"\n', "board.kye"),
    (f'[network]\nke = "{SECRET}"\n', "network.ke"),
    (f'[hosts.supervisor]\npasword = "{SECRET}"\n', "hosts.supervisor.pasword"),
    (f'apikey = "{SECRET}"\n', "apikey"),
    (f'[policy]\nkey = "{SECRET}"\n', "policy.key"),
    (f'[api]\nkey = "{SECRET[:9]}"\n', "api.key"),
    (f'[api]\ntcp = "127.0.0.1:7878"\nkey = "{SECRET[:9]}"\n', "api.key"),
], ids=["board-kye", "network-ke", "supervisor-pasword", "top-apikey", "policy-key",
        "api-key-short", "api-tcp-key-short"])
def test_a_misspelled_or_short_secret_is_refused_without_its_value(tmp_path, text, where):
    """Issue 36: a misspelled key's error echoed its value, so a key put under the wrong name
    landed in logs; ``[api] key`` took any length. Refused, the key named, the value not."""
    cfg = tmp_path / "berth.toml"
    cfg.write_text(text)
    out = subprocess.run([BERTH, "config", "check", str(cfg)], capture_output=True, text=True,
                         timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert where in said, said
    assert SECRET[:9] not in said, said
    assert "Traceback" not in said


def test_a_known_plain_key_in_the_wrong_table_still_shows_its_value():
    from berth.config import ConfigError, parse
    with pytest.raises(ConfigError) as e:
        parse({"reserve": "1GiB", "kye": SECRET})
    said = str(e.value)
    assert "'1GiB'" in said and "kye" in said and SECRET not in said, said


def test_a_misspelled_field_in_a_request_body_is_refused_without_its_value(tmp_path):
    """The control API: an unknown field (a key sent under the wrong name) is a 400 naming
    the field, never repeating its value (berthd's log keeps request errors)."""
    import os

    from tests.berthd import Berthd, api, sim_config
    from tests.helpers import stop_all
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    try:
        status, answer = api(d.sock, "POST", "/v1/leases", {
            "engine": "a", "owner_pid": os.getpid(), "shares": [{"size": "1GiB"}],
            "api_key": SECRET})
        said = answer["error"]["message"]
        assert status == 400 and "api_key" in said and SECRET not in said, answer
        status, answer = api(d.sock, "POST", "/v1/leases", {
            "engine": "a", "owner_pid": os.getpid(), "shares": [{"size": "1GiB"}],
            "priorty": 5})
        assert status == 400 and "priorty" in answer["error"]["message"], answer
        assert SECRET not in d.log.read_text()
    finally:
        stop_all([d.proc], None)
