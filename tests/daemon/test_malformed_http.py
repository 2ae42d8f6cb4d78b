"""Malformed HTTP on berthd's control socket (a new user's report): each is a 400 in berthd's
error shape and one log line naming the fault, never aiohttp's traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from berth.daemon.board_web.listen import MALFORMED_LOG_FIRST, MalformedLog

from tests.berthd import Berthd, sim_config, wait_for
from tests.helpers import stop_all

BAD = {
    "garbage": b"GARBAGE\r\n\r\n",
    "version": b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    "content_length": b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "long_header": b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
}


# The tests of the module-scoped berthd run on one worker (issue 38): spread over the workers,
# each started its own.
SHARED = pytest.mark.xdist_group("malformed_http")


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


@SHARED
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


@SHARED
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


@SHARED
def test_the_query_parameters_berthd_takes_still_pass(berthd):
    code, body = berthd.call("GET", "/v1/timeline?after=0&timeout=0")
    assert code == 200 and "entries" in body, body
    assert berthd.call("GET", "/metrics?name[]=berth_grants_total")[0] == 200


def test_a_flood_of_malformed_requests_is_a_few_lines(tmp_path):
    """A flood of bad requests does not fill berthd's log: the first few lines of the minute,
    then a count (MalformedLog)."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    try:
        for _ in range(40):
            answer = raw(d.sock, BAD["garbage"])
            assert b" 400 " in answer.split(b"\r\n")[0], answer[:300]
        assert d.status()["leases"] == []      # berthd answers a good call after it
        lines = [ln for ln in d.log.read_text().splitlines() if "malformed request on" in ln]
        assert 1 <= len(lines) <= MALFORMED_LOG_FIRST, lines
    finally:
        stop_all([d.proc], tmp_path)


def test_the_malformed_requests_left_out_are_counted_when_the_window_ends(caplog):
    async def scenario() -> None:
        throttle = MalformedLog(first=2, every_s=0.2)
        loop = asyncio.get_running_loop()
        for i in range(7):
            throttle.say(loop, "/run/berth.sock", f"bad request {i}")
        async with asyncio.timeout(10):
            while not any("left out" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.05)
        said = [r.getMessage() for r in caplog.records if r.name == "berth.daemon"]
        assert said == ["malformed request on /run/berth.sock: bad request 0",
                        "malformed request on /run/berth.sock: bad request 1",
                        "5 more malformed request(s) left out of the log in the last 0.2 s "
                        "(the last on /run/berth.sock: bad request 6)"], said
        throttle.say(loop, "/run/berth.sock", "bad request 7")   # a new window: said again
        assert caplog.records[-1].getMessage().endswith("bad request 7")
    with caplog.at_level(logging.WARNING, logger="berth.daemon"):
        asyncio.run(scenario())
