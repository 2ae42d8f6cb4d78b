"""docs/service.md's config and unit are what berthd takes: the TOML blocks validate, the unit
names the commands that exist, and its config check is the one berthd's start runs."""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path

from berth.config import parse

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_pages_toml_validates():
    text = (DOCS / "service.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert blocks
    for b in blocks:
        cfg = parse(tomllib.loads(b))
        assert cfg.api.socket_group == "berth" and cfg.api.socket_mode == 0o660


def test_the_unit_runs_berthd_after_a_config_check():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string((DOCS / "berthd.service").read_text())
    svc = unit["Service"]
    assert svc["ExecStart"].split()[0].endswith("/berthd")
    assert svc["ExecStartPre"].split()[1:] == ["config", "check"]
    assert svc["RuntimeDirectory"] == "berth" and svc["RuntimeDirectoryPreserve"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_verifies_the_unit(tmp_path):
    """systemd's own check of the unit, with /opt/berth's commands taken from this install."""
    import shutil
    import subprocess
    import sys
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing (apt-get install systemd)"
    unit = tmp_path / "berthd.service"
    unit.write_text((DOCS / "berthd.service").read_text().replace(
        "/opt/berth/bin/", str(Path(sys.executable).parent) + "/"))
    p = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
