"""What reaches a user names the field and the value in Berth's words, never pydantic's ("Input
should be a valid boolean", "Field required", a regular expression): ``berth config check``,
berthd's 4xx bodies and ``berth run``'s refusal (review of user-facing text). Before, each
said pydantic's sentence after the key path."""

from __future__ import annotations

import subprocess

from tests.berthd import BERTH

BAD_TOML = """[policy]
queue = "fifo"
[engines.e]
size = "1GiB"
lend = "yes"
"""


def test_config_check_says_each_problem_in_berths_words(tmp_path):
    (tmp_path / "berth.toml").write_text(BAD_TOML)
    out = subprocess.run([BERTH, "config", "check", str(tmp_path / "berth.toml")],
                         capture_output=True, text=True, timeout=30)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert "policy.queue: expected 'strict' or 'scan' (got 'fifo')" in said, said
    assert "engines.e.lend: expected true or false (got 'yes')" in said, said
    assert "Input should" not in said and "Traceback" not in said, said


def test_berthds_4xx_bodies_say_the_field_and_value_in_berths_words(berthd):
    d = berthd()
    code, body = d.call("POST", "/v1/leases", {"engine": "a b", "priority": 5000,
                                               "lend": "yes", "keep_warm": -1})
    msg = body["error"]["message"]
    assert code == 400, body
    for said in ("engine: must have no spaces or control characters (got 'a b')",
                 "priority: must be at most 1000 (got 5000)",
                 "lend: expected true or false (got 'yes')",
                 "keep_warm: must be 0 or more (got -1)"):
        assert said in msg, msg
    code, body = d.call("POST", "/v1/leases", {"priority": 1})
    assert code == 400 and body["error"]["message"] == "engine: missing: this key is required", \
        body
    assert "Input should" not in msg and "Field required" not in body["error"]["message"]
