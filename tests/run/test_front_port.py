"""The front's port taken at start (core/run/front_port.py): a port only a connection holds is
waited for, a port another process listens on ends the run at once.

Seen in CI (the whole suite under xdist on a loaded machine): a bench chose a front port by
``bind(0)`` and closed it, an outgoing connection of another test got the same port as its local
port before ``berth run`` bound it, the run exited 2 ("address already in use") and the soak
timed out waiting for its engine. Here the port is held on purpose, by a live connection bound
to it, and released once the run says it waits."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import struct
import subprocess
from pathlib import Path

from tests.berthd import BERTH, Berthd, berth_run, sim_config, stop_proc
from tests.helpers import free_port, stop_all, wait_for

WAITS = "is held by a connection, not a listener"


class HeldPort:
    """``port`` held as the local port of a live TCP connection (client bound to it, connected
    to a listener of the test's own), not listened on. :meth:`release` resets the connection
    (``SO_LINGER`` 0: an RST, so no ``TIME_WAIT`` keeps the port another 60 s)."""

    def __init__(self, port: int):
        self.port = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.client = socket.socket()
        self.client.bind(("127.0.0.1", port))
        self.client.connect(self.server.getsockname())
        self.peer, _ = self.server.accept()

    def release(self) -> None:
        if self.client.fileno() < 0:
            return                      # released already
        self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for s in (self.client, self.peer, self.server):
            s.close()


def _waits(p: subprocess.Popen, log: Path, port: int) -> bool:
    """The run logged that it waits for ``port``; AssertionError, with its log, if it ended."""
    text = log.read_text() if log.exists() else ""
    assert p.poll() is None, f"berth run exited {p.returncode} with its port held:\n{text}"
    return f"port {port} {WAITS}" in text


def _health(port: int) -> int | None:
    """The front's status for ``GET /health``, or None while nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def test_a_port_held_by_a_connection_is_waited_for_and_the_front_then_serves(tmp_path):
    """Before: the run exited 2 at once ("cannot listen on the front ... address already in
    use") and its engine never started. Now it says once that it waits, naming the port, and
    its front listens and serves once the connection lets the port go."""
    port = free_port()
    held = HeldPort(port)
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    run = berth_run(d, "A", "--front", f"127.0.0.1:{port}", "--size", "8GiB")
    log = tmp_path / "run-A.log"
    try:
        wait_for(lambda: _waits(run, log, port), 60, "the run to say it waits for its port")
        held.release()
        wait_for(lambda: _health(port) == 200, 60, "the front to serve once the port is free")
        wait_for(lambda: (d.lease_of("A") or {}).get("ready"), 60, "A's lease ready")
        assert stop_proc(run) == 0
        text = log.read_text()
        assert text.count(WAITS) == 1 and "Traceback" not in text, text
    finally:
        held.release()
        stop_all([run, d.proc], tmp_path)


def _bare_env(tmp: Path) -> dict[str, str]:
    """A config with no berthd: the front listens before the run reads it, or asks berthd."""
    config = tmp / "berth.toml"
    config.write_text(f'state_dir = "{tmp / "state"}"\n')
    return {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"), "BERTH_CONFIG": str(config),
            "PYTHONUNBUFFERED": "1"}


def test_a_port_another_process_listens_on_ends_the_run_at_once_naming_it(tmp_path):
    """A listener is not waited for: exit 2, one line naming the port, no traceback."""
    with socket.create_server(("127.0.0.1", free_port())) as other:
        port = other.getsockname()[1]
        r = subprocess.run([BERTH, "run", "--engine", "A", "--front", f"127.0.0.1:{port}",
                            "--size", "1GiB", "--", "true", "{port}"], env=_bare_env(tmp_path),
                           capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 2, (r.returncode, out)
    assert (f"--front 127.0.0.1:{port}: the port is already in use (another process listens "
            f"there)") in out and WAITS not in out, out
    assert "Traceback" not in out, out


def test_a_stop_signal_while_waiting_for_the_port_ends_the_run_with_its_code(tmp_path):
    """SIGTERM while the run waits for its port: exit 0 (a manager's stop, as in every other
    state), not 2, and not after the whole wait."""
    port = free_port()
    held = HeldPort(port)
    log = tmp_path / "run.log"
    run = subprocess.Popen([BERTH, "run", "--engine", "A", "--front", f"127.0.0.1:{port}",
                            "--size", "1GiB", "--", "true", "{port}"], env=_bare_env(tmp_path),
                           stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        wait_for(lambda: _waits(run, log, port), 60, "the run to say it waits for its port")
        assert stop_proc(run, signal.SIGTERM, timeout=30) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        held.release()
        stop_all([run], tmp_path)


def test_a_port_still_held_after_the_wait_ends_it_naming_the_port(caplog):
    """The wait is bounded: a port still held by a connection at its end gives up, with the
    reason, once (here a 0.3 s wait in place of 75 s; the front never listened)."""
    import asyncio

    from berth.front import Front
    from berth.run.front_port import listen_front, listener_on

    port = free_port()
    held = HeldPort(port)
    try:
        assert not listener_on(port)
        front = Front("127.0.0.1", port, name="A")
        with caplog.at_level("INFO", logger="berth.run"):
            ok = asyncio.run(listen_front(front, f"127.0.0.1:{port}", asyncio.Event(),
                                          wait_s=0.3))
        assert not ok and not front.listener.listening
        text = caplog.text
        assert text.count(WAITS) == 1, text
        assert f"port {port} is still held by a connection after 0.3 s" in text, text
    finally:
        held.release()
    with socket.create_server(("127.0.0.1", port)):
        assert listener_on(port)
