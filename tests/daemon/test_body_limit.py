"""A body over the control API's limit: a 413 that says the limit (a fresh
user's check, 2026-12-03: the message was aiohttp's reason phrase, "Request Entity Too Large");
a body shorter than its Content-Length: a 408 once the idle limit has passed."""

from __future__ import annotations

import json
import socket

from tests.berthd import api
from tests.helpers import wait_for


def test_a_body_over_the_limit_is_a_413_naming_the_limit(berthd):
    d = berthd()
    code, r = api(d.sock, "POST", "/v1/leases", raw=b"a" * (2 << 20))
    assert code == 413 and r["src"] == "berthd", r
    message = r["error"]["message"]
    assert message.startswith("body: ") and "1048576" in message, message
    assert api(d.sock, "GET", "/v1/health")[0] == 200


def test_a_body_shorter_than_its_content_length_is_a_408_and_others_are_served(berthd):
    """A client that sends fewer body bytes than its Content-Length says used to hold its
    request in berthd forever (aiohttp bounds no body read). berthd now waits for a body at most
    ``[listeners] idle_timeout`` (2 s here), answers 408 naming what came, logs it, and closes;
    other clients are answered meanwhile."""
    d = berthd(extra='[listeners]\nidle_timeout = "2s"\n')
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.settimeout(60)                 # bounds a failure: the answer is due after 2 s
    slow.connect(str(d.sock))
    try:
        slow.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: berthd\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n" + b'{"engine": "x"')
        # the short request waits for its body: others are served all along
        for _ in range(3):
            assert api(d.sock, "GET", "/v1/health")[0] == 200
        raw = b""
        try:           # the answer (aiohttp closes after reading what still comes, up to 10 s)
            while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _length(raw):
                chunk = slow.recv(65536)
                assert chunk, f"closed without a whole answer: {raw!r}"
                raw += chunk
        except TimeoutError:
            raise AssertionError(f"no answer in 60 s (got {raw!r})") from None
    finally:
        slow.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), raw
    doc = json.loads(body)
    message = doc["error"]["message"]
    assert doc["src"] == "berthd" and doc["error"]["code"] == 408, doc
    assert "14 of 100" in message and "2 s" in message, message
    assert b"connection: close" in head.lower(), head
    log = wait_for(lambda: "body" in (t := d.log.read_text()) and "14 of 100" in t and t, 10,
                   "the short body logged")
    assert "Traceback" not in log, log
    assert api(d.sock, "GET", "/v1/health")[0] == 200


def _length(raw: bytes) -> int:
    head = raw.partition(b"\r\n\r\n")[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30
