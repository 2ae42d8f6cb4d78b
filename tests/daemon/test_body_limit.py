"""A body over the control API's limit: a 413 that says the limit (a fresh
user's check, 2026-12-03: the message was aiohttp's reason phrase, "Request Entity Too Large")."""

from __future__ import annotations

from tests.berthd import api


def test_a_body_over_the_limit_is_a_413_naming_the_limit(berthd):
    d = berthd()
    code, r = api(d.sock, "POST", "/v1/leases", raw=b"a" * (2 << 20))
    assert code == 413 and r["src"] == "berthd", r
    message = r["error"]["message"]
    assert message.startswith("body: ") and "1048576" in message, message
    assert api(d.sock, "GET", "/v1/health")[0] == 200
