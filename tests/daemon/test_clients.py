"""Problems a new user found by using Berth as documented; each test failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.berthd import BERTH, Berthd, GiB, api, berth_run, sim_config
from tests.helpers import free_port, wait_for

CKPT = str(BERTH) + "-sim-cuda-checkpoint"
# The tests that read berthd's board or are refused by it, leaving no lease, share one berthd
# (issue 38), on one worker; those that make a lease or stop berthd start their own.
SHARED = pytest.mark.xdist_group("clients")


def _port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_second_berthd_on_the_same_state_directory_is_refused(berthd):
    d = berthd()
    out = subprocess.run([BERTH, "daemon", "--config", str(d.config)], env=d.env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 4 and "another berthd" in out.stderr
    assert d.status()["cards"]                      # the first one still answers


@SHARED
def test_clients_find_the_socket_from_the_configs_state_dir(shared_berthd):
    d = shared_berthd()
    env = {k: v for k, v in d.env.items() if k not in ("BERTH_SOCKET", "BERTH_STATE_DIR")}
    out = subprocess.run([BERTH, "status", "--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr          # found via BERTH_CONFIG's state_dir
    assert json.loads(out.stdout)["cards"][0]["name"] == "gpu0"


def test_berthd_stops_promptly_while_runs_long_poll_it(berthd, runs):
    d = berthd()
    for name in ("A", "B"):
        runs.append(berth_run(d, name, "--size", "2GiB", weights="1GiB"))
    wait_for(lambda: d.state_of("A") == "active" and d.state_of("B") == "active", what="runs")
    wait_for(lambda: all(le["ready"] for le in d.status()["leases"]), what="both serving")
    t0 = time.monotonic()
    d.proc.terminate()
    code = d.proc.wait(60)
    # The runs' long polls last 20 s: a berthd that waited them out takes that long.
    assert time.monotonic() - t0 < 15, "berthd waited out its clients' long polls"
    assert code == 0, code


def test_the_policy_wait_limit_applies_to_the_runs_front(berthd, runs):
    d = berthd(policy={"wait_limit": "1s"})
    api(d.sock, "POST", "/v1/leases", {"engine": "holder", "owner_pid": os.getpid(),
                                      "priority": 9, "shares": [{"card": "gpu0", "size": "20GiB"}]})
    port = _port()
    runs.append(berth_run(d, "B", "--front", f"127.0.0.1:{port}", "--size", "10GiB"))
    wait_for(lambda: d.state_of("B") == "waiting", what="B waiting")
    wait_for(lambda: _listening(port), what="B's front")
    t0 = time.monotonic()
    # The holder has a higher priority, so nothing under way can end B's wait: a client that
    # asks to wait (X-Berth-Deadline) is held to the wait limit; others hear at once (issue 12).
    status, body = _post(port, {"X-Berth-Deadline": "60"})
    assert status == 503 and body["reason"] == "wait_limit"
    assert time.monotonic() - t0 < 30           # 1 s from berth.toml, not the 120 s default


def test_a_wake_nobody_waits_for_is_withdrawn(berthd, runs):
    # A's 14 GiB park at 70 GB/s: 0.2 s, not 2 (the park only sets the scene).
    d = berthd(policy={"min_turn": "30s", "ram_budget": "64GiB"}, checkpoint_rate="70GB")
    port = _port()
    runs.append(berth_run(d, "A", "--front", f"127.0.0.1:{port}", "--size", "14GiB",
                          "--park", "checkpoint", "--checkpoint-path", CKPT,
                          "--wait-limit", "1s", weights="13GiB"))
    wait_for(lambda: (d.lease_of("A") or {}).get("ready"), what="A serving")
    assert d.call("POST", "/v1/operator/park", {"target": "A"})[0] == 200
    wait_for(lambda: d.state_of("A") == "parked", what="A parked")
    runs.append(berth_run(d, "B", "--size", "14GiB", weights="13GiB"))
    wait_for(lambda: (d.lease_of("B") or {}).get("ready"), what="B serving (30 s turn)")
    status, body = _post(port)                   # held 1 s while B keeps its turn, then 503
    assert status == 503
    wait_for(lambda: any(e["kind"] == "wake.off" for e in d.timeline()), what="wake withdrawn")
    assert not d.status()["waiting"]             # nothing left to displace B for, later


def test_nobody_but_the_owner_releases_a_lease(berthd, runs):
    d = berthd()
    runs.append(berth_run(d, "J", "--size", "2GiB", weights="1GiB"))
    wait_for(lambda: d.state_of("J") == "active", what="J")
    lid = d.lease_of("J")["id"]
    # Another process (not an ancestor of J's run, as this test process is) tries it.
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, %r); from tests.berthd import api; "
         "c, r = api(%r, 'POST', '/v1/leases/%s/release', {}); print(c, r)"
         % (os.getcwd(), str(d.sock), lid)], capture_output=True, text=True,
        start_new_session=True)
    assert out.stdout.startswith("403") and "drain" in out.stdout, out.stdout + out.stderr
    assert d.state_of("J") == "active"


@SHARED
def test_a_lease_cannot_be_owned_by_a_process_the_caller_did_not_start(shared_berthd):
    d = shared_berthd()
    for owner in (999_999_999, 1):
        code, r = d.call("POST", "/v1/leases", {"engine": "q", "owner_pid": owner,
                                                "shares": [{"card": "gpu0", "size": "1GiB"}]})
        assert code == 400 and "owner_pid" in r["error"]["message"], r
    assert d.status()["leases"] == []


def test_an_engine_name_with_a_slash_is_a_lease(berthd):
    d = berthd()
    code, r = d.call("POST", "/v1/leases", {"engine": "Qwen/Qwen2.5-7B", "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "1GiB"}]})
    assert code == 201 and "/" not in r["id"]
    assert d.call("GET", f"/v1/leases/{r['id']}")[0] == 200
    out = subprocess.run([BERTH, "hold", "Qwen/Qwen2.5-7B"], env=d.env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("args,needle", [
    (["--front", "nonsense"], "--front: expected HOST:PORT"),
    (["--front", "127.0.0.1:99999"], "--front: expected HOST:PORT"),
    (["--option", "foo"], "--option: expected KEY=VALUE"),
    (["--front", "127.0.0.1:1", "--park", "checkpoint", "--checkpoint-path", "/no/such/tool"],
     "cannot find '/no/such/tool'"),
    (["--wait-limit", "0s"], "--wait-limit: must be more than 0"),
    (["--size", "14"], "--size: '14' has no unit"),
    (["--size", "14@gpu0"], "--size: '14@gpu0' has no unit"),
    # argparse read "-5GiB" as an option ("expected one argument"), naming no size
    (["--size", "-5GiB"], "--size: a size cannot be negative, got '-5GiB'"),
    (["--size=-5GiB"], "--size: a size cannot be negative, got '-5GiB'"),
    (["--lend-max", "-1GiB"], "--lend-max: a size cannot be negative, got '-1GiB'"),
    (["--front", "127.0.0.1:1", "--upstream", "notaurl"], "--upstream: expected the engine's URL"),
    (["--health", "health"], "--health: expected a path starting with '/'"),
    (["--front", "127.0.0.1:1", "--park", "hook", "--adapter", "bogus"],
     "--adapter: no plugin carries out 'bogus'"),
])
def test_bad_run_lines_get_a_message_not_a_traceback(tmp_path, args, needle):
    env = {**os.environ, "BERTH_SOCKET": str(tmp_path / "none.sock")}
    out = subprocess.run([BERTH, "run", *args, "--", "true", "{port}"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_an_engine_that_cannot_be_started_ends_the_run_cleanly(berthd):
    d = berthd()
    out = subprocess.run([BERTH, "run", "--engine", "x", "--size", "1GiB", "--",
                          "/no/such/engine"], env=d.env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 127 and "cannot start x" in out.stderr
    assert "Traceback" not in out.stderr
    wait_for(lambda: d.status()["leases"] == [], what="the lease released")


def test_require_berthd_waits_instead_of_running_unleased(tmp_path, runs):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")]))
    runs.append(berth_run(d, "A", "--size", "2GiB", "--require-berthd", weights="1GiB"))
    log = tmp_path / "run-A.log"
    wait_for(lambda: log.exists() and "waiting for it" in log.read_text(), what="run waiting")
    assert "UNLEASED" not in log.read_text()
    try:
        d.start()
        wait_for(lambda: d.state_of("A") == "active", what="A leased once berthd is up")
    finally:
        d.stop()


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _post(port: int, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                 data=b'{"messages":[{"role":"user","content":"hi"}]}',
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())




@SHARED
def test_two_sizes_without_a_card_on_one_card_are_refused_saying_why(shared_berthd):
    """Two shares naming no card want two cards (issue 25 places each on its own card); on a
    machine with one, the refusal names the field and what to change."""
    d = shared_berthd()
    out = subprocess.run([BERTH, "run", "--size", "1GiB", "--size", "2GiB", "--", "true"],
                         env=d.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stderr
    assert "--size 2GiB: 2 shares want a card of their own and only 1 card can hold" \
        in out.stderr and "card None" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@SHARED
@pytest.mark.parametrize("args,said", [
    (["--size", "100GiB"], "--size 100GiB: 100.0GiB is larger than every card's capacity"),
    (["--size", "1GiB", "--size", "1GiB@gpu7"], "--size 1GiB@gpu7: card 'gpu7': no such card"),
    (["--size", "1GiB", "--priority", "5000"], "--priority: must be at most 1000 (got 5000)"),
    # --alias (each alias and their number) berth run checks itself before asking berthd:
    # tests/run/test_cli_checks.py
    ([], "--size: engine 'x' has no [engines.x] entry in berth.toml; give --size"),
])
def test_berthds_refusal_names_the_flag_the_user_gave(shared_berthd, args, said):
    """berthd names lease fields ("shares.0.size"); the run line the user typed has flags
    ("--size 100GiB"), or, for what it left to berth.toml, the engine's entry."""
    d = shared_berthd()
    out = subprocess.run([BERTH, "run", "--engine", "x", *args, "--", "true"], env=d.env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stderr
    assert f"berthd refused the lease: {said}" in out.stderr, out.stderr
    assert "shares." not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_what_the_run_line_left_to_berth_toml_is_named_as_the_entry():
    from berth.run.cli import RunOptions
    from berth.run.lease import in_flags
    o = RunOptions(cmd=["serve"], engine="big", priority=None)
    assert in_flags("shares.0.size: 99.0GiB is larger than every card's capacity; priority: 5 "
                    "is more than the 0 berth.toml allows; lend: x", o) == (
        "[engines.big] size: 99.0GiB is larger than every card's capacity; [engines.big] "
        "priority: 5 is more than the 0 berth.toml allows; [engines.big] lend: x")
    o = RunOptions(cmd=["serve"], engine="big", sizes=[(None, "1GiB"), ("gpu1", "2GiB")],
                   priority=3, bound="growth", lend=True, lend_max="1GiB", park="hook")
    assert in_flags("shares.1.need: a; bound: b; lend_max: c; park: d; priority: e; lend: f",
                    o) == ("--size 2GiB@gpu1: a; --bound: b; --lend-max: c; --park: d; "
                           "--priority: e; --lend: f")


def test_lend_true_in_the_engines_entry_lends_when_the_run_line_says_nothing(berthd, runs):
    """``berth run`` sent ``"lend": false`` in every lease request when the run line had no
    --lend, so berthd took it as the run's own word and never filled it from the entry:
    ``lend = true`` in berth.toml was silently ignored. The entry's word now holds, and a
    --lend-max on the run line caps that lending (it is refused only where nothing lends)."""
    port = free_port()
    d = berthd(extra=f'[engines.e]\nsize = "2GiB"\nfront = "127.0.0.1:{port}"\nlend = true\n')
    runs.append(berth_run(d, "e", "--front", f"127.0.0.1:{port}", "--lend-max", "1GiB"))
    lease = wait_for(lambda: d.state_of("e") == "active" and d.lease_of("e"), what="e granted")
    caps = lease["capabilities"]
    assert caps["lend"] is True and caps["lend_max_bytes"] == GiB, caps


@SHARED
def test_lend_max_without_lending_is_refused_naming_the_flag(shared_berthd, tmp_path):
    """``--lend-max 2GiB`` with neither --lend nor ``lend = true`` in the entry was taken and
    meant nothing. berthd refuses the lease; the run says so on one line naming --lend-max and
    its value and how to lend, exit 1, and the engine never starts."""
    d = shared_berthd()
    port = free_port()
    marker = tmp_path / "engine-started"
    out = subprocess.run([BERTH, "run", "--engine", "x", "--size", "1GiB", "--lend-max", "2GiB",
                          "--front", f"127.0.0.1:{port}", "--",
                          "sh", "-c", f"touch {marker}; exec sleep 60", "{port}"],
                         env=d.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    # One error line; the front's own log line of its stop may follow it.
    errors = [ln for ln in out.stderr.splitlines() if " ERROR: " in ln]
    assert len(errors) == 1, out.stderr
    said = errors[0]
    assert "berthd refused the lease: --lend-max: 2.0GiB given" in said, said
    assert "--lend" in said.split("--lend-max", 1)[1] and "lend = true in [engines.x]" in said, said
    assert not marker.exists()
    assert d.status()["leases"] == []


def test_berthd_not_reachable_says_where_why_and_how_to_start_it(tmp_path):
    """aiohttp's words ("Cannot connect to unix socket … ssl:default [No such file or
    directory]") named its internals; the message names the socket, why, and `berthd`."""
    import socket
    refused = tmp_path / "refused.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(refused))                     # a socket file nothing listens on
    plain = tmp_path / "berth.toml"
    plain.write_text("")                         # review finding: a regular file was "refused"
    for sock, why in ((tmp_path / "none.sock", "no such file (berthd is not running"),
                      (refused, "connection refused (nothing listens there"),
                      (plain, "not a socket (a regular file is there: $BERTH_SOCKET or"),
                      (tmp_path, "not a socket (a directory is there")):
        out = subprocess.run([BERTH, "status"], env={**os.environ, "BERTH_SOCKET": str(sock)},
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 3, out.stderr
        assert out.stderr.startswith(f"berth: berthd is not reachable at {sock}: {why}"), \
            out.stderr
        assert "start berthd with `berthd`" in out.stderr
        assert "ssl:" not in out.stderr and "Cannot connect" not in out.stderr, out.stderr


def test_a_socket_that_closes_before_answering_is_said_in_words(tmp_path):
    """``berth status`` (the standard library's client, issue 38) says a connection closed
    before the answer in the words aiohttp's did, not as http.client's "RemoteDisconnected"."""
    import socket
    import threading
    sock = tmp_path / "closes.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.listen(4)

    def close_each():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:                      # the listener closed: the test is over
                return
            conn.recv(4096)
            conn.close()
    threading.Thread(target=close_each, daemon=True).start()
    try:
        out = subprocess.run([BERTH, "status"], env={**os.environ, "BERTH_SOCKET": str(sock)},
                             capture_output=True, text=True, timeout=30)
    finally:
        server.close()
    assert out.returncode == 3, out.stderr
    assert out.stderr.startswith(f"berth: berthd is not reachable at {sock}: berthd closed the "
                                 f"connection; start berthd with `berthd`"), out.stderr


def test_a_socket_the_user_may_not_use_is_said_in_words():
    import errno

    from aiohttp.client_exceptions import UnixClientConnectorError
    from berth.client import unreachable
    e = UnixClientConnectorError("/run/berth/berthd.sock", None,
                                         PermissionError(errno.EACCES, "Permission denied"))
    said = unreachable("/run/berth/berthd.sock", e)
    assert said.startswith("berthd is not reachable at /run/berth/berthd.sock: permission "
                           "denied (your user may not use berthd's socket: join the group"), said
    assert "ssl:" not in said
