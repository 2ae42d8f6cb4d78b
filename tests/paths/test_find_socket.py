"""A client that nothing tells where berthd listens looks in the default places (issue 37: a
``berth run`` under a manager started elsewhere, with another environment, found no berthd
unless the BERTH_* variables were shared), and when there is none says in one line what to
set."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

from berth import paths


def _listen(path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


def test_the_first_default_place_with_a_socket_is_taken(tmp_path):
    a, b = tmp_path / "a.sock", tmp_path / "b.sock"
    assert paths.find_socket([a, b]) is None
    b.write_text("not a socket")
    assert paths.find_socket([a, b]) is None
    b.unlink()
    with _listen(b):
        assert paths.find_socket([a, b]) == b


def test_a_client_with_no_variables_finds_berthd_in_a_default_place(tmp_path, monkeypatch):
    for var in ("BERTH_SOCKET", "BERTH_STATE_DIR", "BERTH_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "_client_config", lambda: None)
    there = tmp_path / "berthd.sock"
    monkeypatch.setattr(paths, "default_sockets", lambda: [tmp_path / "none.sock", there])
    with _listen(there):
        assert paths.client_socket() == there
    # A variable that names a socket wins over the search.
    monkeypatch.setenv("BERTH_SOCKET", str(tmp_path / "named.sock"))
    assert paths.client_socket() == tmp_path / "named.sock"


def test_the_default_places_are_this_users_then_a_system_berthd():
    places = paths.default_sockets()
    assert places[0] == paths.state_dir() / "berthd.sock"
    assert paths.Path("/run/berth/berthd.sock") in places
    assert paths.Path(f"/tmp/berth-{os.getuid()}/berthd.sock") in places
    assert paths.Path(f"/run/user/{os.getuid()}/berth/berthd.sock") in places
    assert len(set(places)) == len(places)


def test_no_berthd_anywhere_says_in_one_line_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["BERTH_SOCKET"] = str(tmp_path / "nobody.sock")
    r = subprocess.run([sys.executable, "-m", "berth.cli", "status"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "set BERTH_SOCKET to its socket" in lines[0] and "`berthd ready on PATH`" in lines[0]


def test_the_log_line_the_message_points_to_names_the_socket(tmp_path):
    """The message said BERTH_SOCKET is in "berthd's first log line", but with a board on (the
    default) berthd's first line is the board's address: the message quotes the line that
    names the socket, and berthd logs it."""
    from berth.client_sync import _WHY

    from tests.berthd import Berthd, sim_config
    from tests.helpers import free_port, wait_for

    said = _WHY[errno.ENOENT]
    assert "`berthd ready on PATH`" in said, said
    cfg = sim_config(tmp_path, [("gpu0", "4GiB")],
                     extra=f'[board]\nlisten = "127.0.0.1:{free_port()}"\n')
    d = Berthd(tmp_path, cfg).start()
    try:
        wait_for(lambda: "berthd ready on" in d.log.read_text(), 20, "berthd's ready line")
        [line] = [x for x in d.log.read_text().splitlines() if "berthd ready on" in x]
        assert f"berthd ready on {d.sock} " in line, line
    finally:
        d.stop()
