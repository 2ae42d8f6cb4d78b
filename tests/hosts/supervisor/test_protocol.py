"""The eventlistener protocol: ``len`` counts characters, stdout is guarded, a desync exits
non-zero (reference/hosts.md "Eventlistener protocol", "Pitfalls")."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from berth_hosts.supervisor.protocol import Protocol, ProtocolError, parse_header, parse_tokens

PY = sys.executable


def envelope(eventname: str, payload: str, serial: int = 1) -> str:
    """What supervisord writes (``_eventEnvelope``): ``len`` is ``len()`` of the str."""
    return (f"ver:3.0 server:supervisor serial:{serial} pool:berth poolserial:{serial} "
            f"eventname:{eventname} len:{len(payload)}\n{payload}")


STATE = "processname:modèle-ü groupname:modèle-ü from_state:STARTING pid:4242"


def test_len_counts_characters_not_bytes():
    assert len(STATE.encode()) != len(STATE)           # the case that desyncs a byte reader
    stream = io.StringIO(envelope("PROCESS_STATE_RUNNING", STATE, 1)
                         + envelope("TICK_5", "when:1700000000", 2))
    r, w = os.pipe()
    try:
        proto = Protocol(stream, w)
        ev = proto.read_event()
        assert ev.name == "PROCESS_STATE_RUNNING"
        assert ev.fields == {"processname": "modèle-ü", "groupname": "modèle-ü",
                             "from_state": "STARTING", "pid": "4242"}
        tick = proto.read_event()                      # the next header starts exactly here
        assert tick.name == "TICK_5" and tick.fields == {"when": "1700000000"}
        assert proto.read_event() is None              # EOF between events
        proto.ready()
        proto.ok()
        assert os.read(r, 100) == b"READY\nRESULT 2\nOK"
    finally:
        os.close(r)
        os.close(w)


def test_payload_read_from_a_pipe_of_utf8_bytes_split_mid_character():
    r, w = os.pipe()
    data = envelope("PROCESS_STATE_STOPPED", STATE).encode()
    cut = data.index("è".encode()) + 1                 # split inside a two-byte character
    os.write(w, data[:cut])
    os.write(w, data[cut:])
    os.close(w)
    stdin = io.TextIOWrapper(os.fdopen(r, "rb"), encoding="utf-8", newline="\n")
    ev = Protocol(stdin, 2).read_event()
    assert ev.fields["processname"] == "modèle-ü" and ev.payload == STATE
    stdin.close()


def test_communication_payload_keeps_its_data():
    payload = "processname:p groupname:p pid:1\nhello ü\nworld"
    ev = Protocol(io.StringIO(envelope("PROCESS_COMMUNICATION_STDOUT", payload)), 2).read_event()
    assert ev.fields["pid"] == "1" and ev.data == "hello ü\nworld"


@pytest.mark.parametrize("text, message", [
    ("garbage\n", "not key:value"),
    ("ver:3.0 server:s serial:1 pool:b poolserial:1 eventname:TICK_5\n", "lacks len"),
    ("ver:3.0 server:s serial:1 pool:b poolserial:1 eventname:TICK_5 len:x\n", "not a number"),
    ("ver:3.0 server:s serial:1 pool:b poolserial:1 eventname:TICK_5 len:9\nwhen:1", "cut short"),
    ("ver:3.0 server:s serial:1 pool:b poolserial:1 eventname:TICK_5 len:9", "cut short"),
])
def test_desync_is_an_error(text, message):
    with pytest.raises(ProtocolError, match=message):
        Protocol(io.StringIO(text), 2).read_event()


def test_tokens_keep_colons_in_values():
    assert parse_tokens("a:1 b:x:y") == {"a": "1", "b": "x:y"}
    assert parse_header("ver:3.0 server:s serial:1 pool:b poolserial:1 eventname:E len:0\n")[
        "len"] == "0"


def test_guard_stdout_keeps_the_protocol_alone_on_stdout():
    code = ("import os, subprocess, sys\n"
            "from berth_hosts.supervisor.protocol import guard_stdout\n"
            "fd = guard_stdout()\n"
            "print('a stray print')\n"
            "sys.stdout.write('a stray write\\n'); sys.stdout.flush()\n"
            "os.write(1, b'a stray os.write\\n')\n"
            "subprocess.run(['echo', 'a child process'])\n"
            "os.write(fd, b'READY\\n')\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"READY\n"
    for noise in (b"a stray print", b"a stray write", b"a stray os.write", b"a child process"):
        assert noise in r.stderr


def _listen(tmp_path, stdin: bytes) -> subprocess.CompletedProcess:
    """``berth supervisor listen`` fed ``stdin``; supervisord and berthd are absent (the
    listener keeps retrying them off the protocol loop)."""
    cfg = tmp_path / "berth.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                   f'[api]\nsocket = "{tmp_path / "none.sock"}"\n'
                   f'[hosts.supervisor]\nurl = "unix://{tmp_path / "none-sv.sock"}"\n'
                   '[engines."modèle-ü"]\nsupervisor = "modèle-ü"\nsize = "1GiB"\n',
                   encoding="utf-8")
    return subprocess.run([PY, "-m", "berth.cli", "supervisor", "listen", "--config", str(cfg)],
                          input=stdin, capture_output=True, timeout=30,
                          env={**os.environ, "SUPERVISOR_PROCESS_NAME": "berth"})


def test_listener_acknowledges_events_then_exits_0_at_eof(tmp_path):
    events = (envelope("PROCESS_STATE_RUNNING", STATE, 1)
              + envelope("PROCESS_STATE_RUNNING", "processname:berth groupname:berth "
                                                  "from_state:STARTING pid:1", 2)
              + envelope("TICK_5", "when:1700000000", 3))
    r = _listen(tmp_path, events.encode())
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"READY\n" + b"RESULT 2\nOKREADY\n" * 3
    err = r.stderr.decode()
    assert "PROCESS_STATE_RUNNING modèle-ü (pid 4242)" in err
    assert "closed the event stream" in err


def test_listener_exits_non_zero_on_desync(tmp_path):
    bad = envelope("TICK_5", "when:1").replace("len:6", "len:oops")
    r = _listen(tmp_path, bad.encode())
    assert r.returncode == 3, r.stderr.decode()
    assert r.stdout == b"READY\n"
    assert "protocol desync" in r.stderr.decode()
