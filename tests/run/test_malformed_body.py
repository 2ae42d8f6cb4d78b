"""A malformed chunked request body sent to a sleeping front is a 400 and wakes nothing.

The front holds a write whose body streams (chunked, or over 1 MiB) from its head on. It used to
ask for the card at once, before the body had arrived: a body that then turned out malformed
closed the connection without an answer, and the engine was woken (parked) or started again
(drained, issue 35) for a request that was never going to be sent. Now the wake waits for the
body (whole, or its first MiB); a malformed one gets a 400 that names what is wrong, and the
front stays asleep. A real berthd, a real ``berth run`` on the simulated card, a raw socket.
"""

from __future__ import annotations

import json
import socket

from tests.helpers import wait_for
from tests.run.test_front_rules import _request
from tests.run.world import chat, run_cmd

_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")
_FIRST = b'{"model": "A", '
_BAD = b"zz\r\n"        # a chunk size that is not hexadecimal


def _held_then_broken(port: int, holding) -> tuple[int, dict]:
    """Send a chunked write's head and first chunk, wait until ``holding()`` says the front
    holds it, then a malformed chunk size; return the answer's status and JSON body
    (``(0, {})``: the connection closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(_HEAD + b"%x\r\n%s\r\n" % (len(_FIRST), _FIRST))
        wait_for(holding, 60, "the chunked write held by the front")
        s.sendall(_BAD)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    except ConnectionResetError:
        pass
    finally:
        s.close()
    if not raw:
        return 0, {}
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _bad_body_400(status: int, body: dict) -> None:
    assert status == 400, (status, body)
    assert body["src"] == "berth" and body["reason"] == "malformed_body", body
    msg = body["error"]["message"]
    assert body["error"]["code"] == 400 and "chunk" in msg.lower(), body
    assert "Traceback" not in msg


def _front_reason(port: int) -> str:
    """The state the front names in its 503 to a read (a read never wakes it)."""
    status, body, _, _ = _request(port, "GET", "/v1/models")
    assert status == 503, body
    return body["reason"]


def test_a_malformed_chunked_body_to_a_parked_front_is_a_400_and_no_wake(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    a.start()
    code, r = world.operator("park", "A")
    assert code == 200, r
    wait_for(lambda: d.state_of("A") == "parked", 60, "A parked")
    seq = max(e["seq"] for e in d.timeline())

    status, body = _held_then_broken(
        a.port, lambda: (d.lease_of("A") or {}).get("in_flight") == 1)
    _bad_body_400(status, body)
    # A wake moves the front to "waking" before anything else: it still says "asleep".
    assert _front_reason(a.port) == "asleep"
    assert d.state_of("A") == "parked"
    asked = [e for e in d.timeline() if e["seq"] > seq and e["engine"] == "A"]
    assert not [e for e in asked if e["kind"] in ("wake", "resume")], asked
    # The control: a well-formed write wakes it and is answered.
    assert chat(a.port, "A", max_tokens=4).finish_reason == "length"


def test_a_malformed_chunked_body_to_a_drained_front_is_a_400_and_no_new_grant(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A", park=False))
    a.start()
    code, r = world.operator("drain", "A")
    assert code == 200, r

    def drained() -> dict | None:
        return next((e for e in d.status()["drained"] if e["engine"] == "A"), None)
    wait_for(drained, 60, "A listed as drained")

    status, body = _held_then_broken(a.port, lambda: (drained() or {}).get("waiters") == 1)
    _bad_body_400(status, body)
    assert _front_reason(a.port) == "asleep"
    entry = wait_for(lambda: (drained() or {}).get("waiters") == 0 and drained(), 30,
                     "the refused write no longer counted as a waiter")
    assert not entry["asking"], entry
    assert d.lease_of("A") is None, d.lease_of("A")
    # The control: a well-formed write starts the engine again and is answered.
    assert chat(a.port, "A", max_tokens=4).finish_reason == "length"
