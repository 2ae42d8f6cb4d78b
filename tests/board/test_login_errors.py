"""Every error of the board's ``POST /login`` is JSON ``{"error": ...}`` with a 4xx that names
the field, and none echoes the key (issue 15's page reads ``doc.error``; a fresh user's check,
2026-12-03: a body that was not JSON, a GET and a body over the limit were answered in aiohttp's
plain text, so the page said only the status). A real berthd's board listener, raw HTTP.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers import free_port

KEY = "board-key-for-login-tests-0123"

# One worker runs the module: its tests share one berthd (issue 38); none leaves anything the
# others read (a sign-in's session is not sent by any other).
pytestmark = pytest.mark.xdist_group("login_errors")


@pytest.fixture(scope="module")
def board(shared_berthd) -> int:
    port = free_port()
    shared_berthd(extra=f'[board]\nlisten = "127.0.0.1:{port}"\nkey = "{KEY}"\n')
    return port


def _call(port: int, method: str, path: str, body: bytes | None) -> tuple[int, str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        r = conn.getresponse()
        raw = r.read().decode(errors="replace")
        assert r.getheader("Content-Type", "").startswith("application/json"), (r.status, raw)
        return r.status, raw, json.loads(raw)
    finally:
        conn.close()


@pytest.mark.parametrize("method, body, status, names", [
    ("POST", b"name=ada&key=x", 400, "body"),                              # a form, not JSON
    ("POST", b"[" * 60_000, 400, "body"),                                  # nested too deep
    ("POST", b'["ada"]', 400, "body"),                                     # JSON, not an object
    ("POST", b'{"key": "%s"}' % KEY.encode(), 400, "name"),                # no name
    ("POST", b'{"name": "ada"}', 400, "key"),                              # no key
    ("POST", b'{"name": "ada", "key": 1234567}', 400, "key"),              # a key not a string
    ("POST", b'{"name": "ada", "key": "a-wrong-secret-9876"}', 403, "key"),
    ("POST", b'{"name": "%s", "key": ""}' % KEY.encode(), 400, "name"),    # the key as a name
    ("POST", b'{"name": "ada", "key": "' + b"k" * (80 << 10) + b'"}', 413, "body"),
    ("GET", None, 405, "POST"),
    ("PUT", b'{"name": "ada", "key": "a-wrong-secret-9876"}', 405, "POST"),
])
def test_every_login_error_is_json_naming_the_field_and_never_the_key(board, method, body,
                                                                    status, names):
    code, raw, doc = _call(board, method, "/login", body)
    assert code == status, (code, raw)
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc
    assert names in doc["error"], doc
    for secret in (KEY, "a-wrong-secret-9876", "1234567"):
        assert secret not in raw, raw
    assert "Traceback" not in raw


def test_the_right_key_still_signs_in(board):
    code, raw, doc = _call(board, "POST", "/login",
                           json.dumps({"name": "ada", "key": KEY}).encode())
    assert code == 200 and doc == {"operator": True, "who": "ada"}, raw
