"""Malformed HTTP on berthd's control socket (a new user's report): each is a 400 in berthd's
error shape and one log line naming the fault, never aiohttp's traceback."""

from __future__ import annotations

import json
import socket

import pytest

from tests.berthd import Berthd, sim_config, wait_for
from tests.helpers import stop_all

BAD = {
    "garbage": b"GARBAGE\r\n\r\n",
    "version": b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    "content_length": b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "long_header": b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
}


@pytest.fixture(scope="module")
def berthd(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("malformed")
    d = Berthd(tmp, sim_config(tmp, [("gpu0", "24GiB")])).start()
    yield d
    stop_all([d.proc], tmp)


def raw(sock, data: bytes) -> bytes:
    """``data`` sent on a fresh connection; all berthd answers until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_request_is_one_line_and_a_json_400(berthd, name):
    before = berthd.log.read_text()
    answer = raw(berthd.sock, BAD[name])
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"400", answer[:300]
    err = json.loads(body)
    assert err["src"] == "berthd" and err["error"]["code"] == 400, err
    assert err["error"]["type"] == "invalid_request" and err["error"]["message"], err
    wait_for(lambda: "malformed request" in berthd.log.read_text()[len(before):], 20,
             "berthd to log the malformed request")
    new = berthd.log.read_text()[len(before):]
    assert "Traceback" not in new and "ERROR" not in new, new
    assert len([ln for ln in new.splitlines() if "malformed request" in ln]) == 1, new
    # berthd still answers a good call after it
    assert berthd.status()["leases"] == []


@pytest.mark.parametrize("path, name, value", [
    ("/v1/timeline?since=abc", "since", "abc"),          # the report: the parameter is after
    ("/v1/timeline?after=1&timout=5", "timout", "5"),
    ("/v1/status?watch=1", "watch", "1"),
    ("/v1/timeline?after=1.5", "after", "1.5"),          # a sequence number is whole
])
def test_a_query_parameter_berthd_does_not_take_is_a_400_naming_it(berthd, path, name, value):
    code, body = berthd.call("GET", path)
    assert code == 400, (path, code, body)
    msg = body["error"]["message"]
    assert name in msg and repr(value) in msg, msg


def test_the_query_parameters_berthd_takes_still_pass(berthd):
    code, body = berthd.call("GET", "/v1/timeline?after=0&timeout=0")
    assert code == 200 and "entries" in body, body
    assert berthd.call("GET", "/metrics?name[]=berth_grants_total")[0] == 200
