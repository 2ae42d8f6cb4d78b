"""The board's operator endpoint from a script: a signed-in session without the page's
``X-Berth-Board: 1`` header is told that header is what is missing, not that it lacks the key."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

from tests.berthd import Berthd, sim_config

KEY = "a board key of twenty characters"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, doc: dict, headers: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_a_signed_in_session_without_the_board_header_is_told_what_is_missing(tmp_path):
    """A user who signed in with curl and posted ``operator/park`` with the session cookie got
    ``operator actions need the board's key``, though the key was right: the refusal was the
    board's cross-site guard, the ``X-Berth-Board: 1`` header its page sends. It is still a
    403, and it names the header (and ``Authorization: Bearer``), never the key."""
    port = _port()
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")],
                     extra=f'[board]\nlisten = "127.0.0.1:{port}"\nkey = "{KEY}"\n')
    d = Berthd(tmp_path, cfg).start()
    try:
        base = f"http://127.0.0.1:{port}/"
        code, body, headers = _post(base + "login", {"name": "ana", "key": KEY}, {})
        assert code == 200, body
        cookie = headers["Set-Cookie"].split(";")[0]
        code, body, _ = _post(base + "operator/park", {"target": "nosuch"}, {"Cookie": cookie})
        assert code == 403 and "X-Berth-Board: 1" in body["error"], body
        assert "Bearer" in body["error"] and KEY not in json.dumps(body), body
        code, body, _ = _post(base + "operator/park", {"target": "nosuch"},
                              {"Cookie": cookie, "X-Berth-Board": "1"})
        assert code == 404 and "nosuch" in body["error"], body
        code, body, _ = _post(base + "operator/park", {"target": "nosuch"}, {})
        assert code == 403 and "key" in body["error"], body
    finally:
        d.stop()
