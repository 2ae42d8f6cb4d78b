"""A port another process listens on, given to each of Berth's listeners (a new user's find,
2026-12-04): ``berth run --front`` exited 2, ``berth gateway --listen`` 1 and berthd's
``[api] tcp`` 4, and the last two named neither the flag nor the key ("cannot listen: error
while attempting to bind on address (...)"). Now each exits 2, as bad input does, with one line
naming the flag or key and the address, and no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.berthd import BERTH, sim_config
from tests.helpers import free_port

TAKEN = "the port is already in use (another process listens there)"


def _env(tmp: Path, config: Path | None = None) -> dict[str, str]:
    """No berthd: each command fails at its listener, before (or without) asking it."""
    if config is None:
        config = tmp / "berth.toml"
        config.write_text(f'state_dir = "{tmp / "state"}"\n')
    return {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"), "BERTH_CONFIG": str(config),
            "BERTH_SOCKET": str(tmp / "none.sock"), "PYTHONUNBUFFERED": "1"}


def _taken_port_refuses(argv: list[str], env: dict[str, str], port: int, named: str) -> None:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 2, (r.returncode, out)
    assert f"{named}: {TAKEN}" in out, out
    assert "Traceback" not in out and "Errno" not in out, out


@pytest.mark.parametrize("flag", ["--listen", "--comfyui-listen"])
def test_berth_gateway_names_its_flag_and_exits_2(tmp_path, flag):
    with socket.create_server(("127.0.0.1", free_port())) as other:
        port = other.getsockname()[1]
        address = f"127.0.0.1:{port}"
        argv = [BERTH, "gateway", flag, address]
        if flag != "--listen":
            argv += ["--listen", f"127.0.0.1:{free_port()}"]
        _taken_port_refuses(argv, _env(tmp_path), port, f"berth gateway: {flag} {address}")


def test_berthd_names_api_tcp_and_exits_2(tmp_path):
    with socket.create_server(("127.0.0.1", free_port())) as other:
        port = other.getsockname()[1]
        config = sim_config(tmp_path, [("gpu0", "24GiB")], extra=(
            f'[api]\ntcp = "127.0.0.1:{port}"\nkey = "{"k" * 32}"\n'))
        _taken_port_refuses([BERTH, "daemon", "--config", str(config)], _env(tmp_path, config),
                            port, f"[api] tcp = '127.0.0.1:{port}'")


def test_berth_run_names_front_and_exits_2(tmp_path):
    with socket.create_server(("127.0.0.1", free_port())) as other:
        port = other.getsockname()[1]
        _taken_port_refuses([BERTH, "run", "--engine", "A", "--front", f"127.0.0.1:{port}",
                             "--size", "1GiB", "--", "true", "{port}"], _env(tmp_path), port,
                            f"--front 127.0.0.1:{port}")


@pytest.mark.parametrize("command", ["daemon", "gateway", "run"])
def test_the_exit_code_is_in_the_commands_help(command):
    """The code is documented where each command lists its exit codes."""
    p = subprocess.run([BERTH, command, "--help"], capture_output=True, text=True, timeout=60)
    said = " ".join(p.stdout.split())
    assert p.returncode == 0 and "exit codes:" in said, said
    assert "2 for " in said.partition("exit codes:")[2], said
    assert "another process listens on" in said.partition("exit codes:")[2], said
