"""One rule finds berth.toml for every process, and a config that cannot be used stops each
of them with one line naming it (issue 23 "One home per rule"): ``BERTH_CONFIG`` naming a
missing file is refused by berthd, ``berth status``, ``berth run`` and the gateway alike (the
gateway used to run on the defaults), and a client whose config does not load names the
config, not "berthd is not reachable at /run/berth/…"."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess

import pytest
from berth.config import load_config

from tests.berthd import BERTH
from tests.helpers import sweep


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A place with no berthd: its own state directory and socket, no config of its own."""
    e = {"BERTH_STATE_DIR": str(tmp_path), "BERTH_SOCKET": str(tmp_path / "berthd.sock"),
         "BERTH_SIM_DIR": str(tmp_path / "sim"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    for k, v in e.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("BERTH_CONFIG", raising=False)
    yield e
    sweep(tmp_path)


def _commands() -> dict[str, list[str]]:
    engine = ["python3", "-c", "import time; time.sleep(30)", "{port}"]
    return {
        "berthd": [BERTH, "daemon"],
        "berth": [BERTH, "status"],
        "berth run": [BERTH, "run", "--engine", "e", "--front", f"127.0.0.1:{_port()}",
                      "--", *engine],
        "berth gateway": [BERTH, "gateway", "--listen", f"127.0.0.1:{_port()}"],
    }


def _refused(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run ``argv``; it must end by itself (a gateway on the defaults would serve on)."""
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"berth {argv[1]} ran on instead of refusing the config") from None


def test_berth_config_naming_a_missing_file_is_refused_everywhere_in_one_line(env, tmp_path):
    missing = tmp_path / "nowhere" / "berth.toml"
    run_env = {**os.environ, **env, "BERTH_CONFIG": str(missing)}
    line = f"{missing}: no such file (named by BERTH_CONFIG)"
    wrong = {}
    for prog, argv in _commands().items():
        try:
            done = _refused(argv, run_env)
        except AssertionError as e:
            wrong[prog] = str(e)
            continue
        if done.returncode != 2 or done.stderr.splitlines() != [f"{prog}: {line}"]:
            wrong[prog] = (done.returncode, done.stderr)
    assert not wrong, wrong


def test_a_missing_config_flag_is_refused_too(env, tmp_path):
    missing = tmp_path / "typo.toml"
    done = _refused([BERTH, "daemon", "--config", str(missing)], {**os.environ, **env})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"berthd: {missing}: no such file (named by --config)"]


def test_the_rule_is_flag_then_environment_then_default_place(env, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)     # the default place: XDG_CONFIG_HOME's
    assert load_config()[1] is None                      # nothing anywhere: the defaults
    default = tmp_path / "xdg" / "berth" / "berth.toml"
    default.parent.mkdir(parents=True)
    default.write_text('state_dir = "/tmp/default"\n')
    assert load_config()[1] == default
    named = tmp_path / "named.toml"
    named.write_text('state_dir = "/tmp/named"\n')
    monkeypatch.setenv("BERTH_CONFIG", str(named))
    assert load_config()[1] == named
    flag = tmp_path / "flag.toml"
    flag.write_text('state_dir = "/tmp/flag"\n')
    cfg, found = load_config(flag)
    assert found == flag and cfg.state_dir == "/tmp/flag"


@pytest.fixture
def broken(env, tmp_path, monkeypatch):
    """``BERTH_CONFIG`` naming a file that is not TOML, and no ``BERTH_SOCKET``: the socket is
    the config's to say."""
    path = tmp_path / "berth.toml"
    path.write_text('state_dir = "/tmp/x"\n[api\nsocket = "/tmp/x.sock"\n')
    monkeypatch.setenv("BERTH_CONFIG", str(path))
    monkeypatch.delenv("BERTH_SOCKET")
    return path


def test_a_client_whose_config_does_not_load_names_the_config(broken):
    from berth.client import BerthdUnavailable, Client
    with pytest.raises(BerthdUnavailable) as e:      # callers that fail open still do
        asyncio.run(Client().status())
    assert f"{broken}: (toml): " in str(e.value), str(e.value)
    assert "not reachable" not in str(e.value)
    done = subprocess.run([BERTH, "status"], env=dict(os.environ), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"berth: {broken}: (toml): "), done.stderr
    assert "not reachable" not in done.stderr


def test_berth_run_with_a_config_that_does_not_load_starts_no_engine(broken):
    done = _refused(_commands()["berth run"], dict(os.environ))
    assert done.returncode == 2, done.stderr
    assert f"ERROR: {broken}: (toml): " in done.stderr
    assert "UNLEASED" not in done.stderr and "started e" not in done.stderr, done.stderr
