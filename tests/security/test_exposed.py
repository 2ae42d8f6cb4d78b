"""A warning at start for any listener other machines can reach (issue 26, Low): berthd's
``[board] listen`` and ``[api] tcp``, and the gateway's ``--listen``. Real processes; the
addresses are this machine's unspecified address on a free port, so nothing leaves it."""

from __future__ import annotations

import subprocess

from berth.exposed import is_loopback

from tests.berthd import BERTH, Berthd, sim_config, wait_for
from tests.gateway.world import free_port, http

KEY = "an-api-key-of-enough-length-0123"


def test_loopback_addresses():
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "[::]", "192.168.1.5", "example.com", ""):
        assert not is_loopback(host), host


def test_berthd_warns_of_a_board_and_an_api_on_every_address(tmp_path):
    board, api = free_port(), free_port()
    cfg = sim_config(tmp_path, [("gpu0", "8GiB")],
                     extra=f'[board]\nlisten = "0.0.0.0:{board}"\n'
                           f'[api]\ntcp = "0.0.0.0:{api}"\nkey = "{KEY}"\n')
    d = Berthd(tmp_path, cfg).start()
    try:
        wait_for(lambda: "berthd ready" in d.log.read_text(), 20, "berthd ready")
        log = d.log.read_text()
        assert f"[board] listen 0.0.0.0:{board} is not a loopback address" in log, log
        assert f"[api] tcp 0.0.0.0:{api} is not a loopback address" in log, log
    finally:
        d.stop()


def test_berthd_on_loopback_says_nothing(tmp_path):
    cfg = sim_config(tmp_path, [("gpu0", "8GiB")],
                     extra=f'[board]\nlisten = "127.0.0.1:{free_port()}"\n'
                           f'[api]\ntcp = "127.0.0.1:{free_port()}"\nkey = "{KEY}"\n')
    d = Berthd(tmp_path, cfg).start()
    try:
        wait_for(lambda: "berthd ready" in d.log.read_text(), 20, "berthd ready")
        assert "not a loopback address" not in d.log.read_text()
    finally:
        d.stop()


def test_the_gateway_warns_of_a_listener_on_every_address(tmp_path):
    cfg = sim_config(tmp_path, [("gpu0", "8GiB")], extra='[board]\nlisten = "off"\n')
    d = Berthd(tmp_path, cfg).start()
    port = free_port()
    log = tmp_path / "gw.log"
    gw = subprocess.Popen([BERTH, "gateway", "--listen", f"0.0.0.0:{port}", "--config",
                           str(cfg)], env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "not a loopback address" in log.read_text() or gw.poll() is not None,
                 30, "the gateway's warning")
        assert f"berth gateway --listen 0.0.0.0:{port} is not a loopback address" \
            in log.read_text(), log.read_text()
        assert http(port, "GET", "/v1/models")[0] == 200
    finally:
        gw.terminate()
        gw.wait(10)
        d.stop()
