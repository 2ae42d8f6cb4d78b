"""The front of ``berth run`` keeps seed 002's promises (issue 5): a held request ends with a 503
that names the limit, never a hang; a read never wakes a parked engine; a client that goes away
mid-stream stops the engine's generation."""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest

from tests.helpers import openai, wait_for
from tests.run.llamaswap import UNLOAD_TIMEOUT_S
from tests.run.world import chat, run_cmd

CHAT = {"model": "B", "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]}


def _request(port: int, method: str, path: str, body: dict | None = None,
             timeout_s: float = 30.0, headers: dict | None = None
             ) -> tuple[int, dict, dict[str, str], float]:
    """One HTTP request: (status, JSON body or {}, headers, seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    t0 = time.monotonic()
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data,
                     headers={**({"Content-Type": "application/json"} if data else {}),
                              **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
        elapsed = time.monotonic() - t0
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw.decode(errors="replace")}
        return r.status, parsed, {k.lower(): v for k, v in r.getheaders()}, elapsed
    finally:
        conn.close()


def _berth_503(body: dict, reason: str) -> None:
    """OpenAI's error shape, plus llama-swap's ``src`` and Berth's ``reason``."""
    assert body["src"] == "berth" and body["reason"] == reason, body
    err = body["error"]
    assert err["code"] == 503 and err["type"] == "unavailable_error" and err["message"], body


def test_a_write_held_past_the_wait_limit_gets_a_503_naming_the_limit(world):
    d = world.start_berthd()
    # A holder of higher priority that cannot park: B's lease can never be granted.
    code, r = d.call("POST", "/v1/leases", {"engine": "holder", "priority": 100,
                                            "owner_pid": os.getpid(),
                                            "shares": [{"card": "gpu0", "size": "20GiB"}]})
    assert code == 201 and r["state"] == "active", r
    b = world.model("B", run_cmd("B", park=False, run_args=("--wait-limit", "1s")))
    b.spawn()
    wait_for(lambda: d.state_of("B") == "waiting", 60, "B waiting for its lease")
    wait_for(lambda: b.health() == 503, 60, "B's front listening")
    # Nothing under way can end B's wait (the holder has the higher priority): a client that
    # asks to wait (X-Berth-Deadline) is held to the wait limit (issue 12 case 6).
    status, body, headers, elapsed = _request(b.port, "POST", "/v1/chat/completions", CHAT,
                                              headers={"X-Berth-Deadline": "60"})
    assert status == 503, body
    _berth_503(body, "wait_limit")
    assert "wait limit" in body["error"]["message"] and "1 s" in body["error"]["message"], body
    assert headers.get("retry-after") == "1"
    assert 0.9 <= elapsed < 20, elapsed        # the 1 s wait limit, not the client's 60 s
    # The same answer through the OpenAI client: an APIStatusError, not a hang.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{b.port}/v1", api_key="x", max_retries=0,
                           timeout=30, default_headers={"X-Berth-Deadline": "60"})
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="B", messages=CHAT["messages"], max_tokens=4,
                                       stream=True)
    assert exc.value.status_code == 503 and time.monotonic() - t0 < 20
    _berth_503(exc.value.response.json(), "wait_limit")
    client.close()
    assert d.state_of("B") == "waiting"
    # llama-swap's stop while the run still waits: it withdraws its lease and exits at once.
    st = b.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st
    wait_for(lambda: d.lease_of("B") is None, 30, "B's lease withdrawn")


def test_a_read_never_wakes_a_parked_engine(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    a.start()
    code, r = world.operator("park", "A")
    assert code == 200, r
    wait_for(lambda: d.state_of("A") == "parked", 60, "A parked")
    seq = max(e["seq"] for e in d.timeline())
    # A write moves the front to "waking" before it answers anything, so a read that woke the
    # engine would make every later read say "waking": each one must still say "asleep".
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/health"),
                         ("HEAD", "/v1/models"), ("OPTIONS", "/v1/chat/completions"),
                         ("GET", "/v1/models")):
        status, body, headers, _ = _request(a.port, method, path)
        assert status == 503, (method, path, body)
        if method != "HEAD":
            _berth_503(body, "asleep")
            assert "asleep" in body["error"]["message"]
            assert "never wakes" in body["error"]["message"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as exc:
        client.models.list()
    assert exc.value.status_code == 503
    _berth_503(exc.value.response.json(), "asleep")
    client.close()
    assert d.state_of("A") == "parked"
    asked = [e for e in d.timeline() if e["seq"] > seq and e["engine"] == "A"]
    assert not [e for e in asked if e["kind"] in ("wake", "resume")], asked
    # The control: a write does wake it, and is answered in full.
    ans = chat(a.port, "A", max_tokens=4)
    assert ans.content_chunks == 4 and ans.finish_reason == "length"
    wait_for(lambda: d.state_of("A") == "active", 30, "A's wake reported")
    assert [c.oom_events for c in world.sim().cards] == [0]


def _state(port: int) -> dict:
    status, body, _, _ = _request(port, "GET", "/berth/v1/state", timeout_s=30)
    assert status == 200, body
    return body


def test_a_client_gone_mid_stream_stops_the_engines_generation(world):
    world.start_berthd()
    a = world.model("A", run_cmd("A", size="4GiB", weights="1GiB", park=False,
                                 engine_args=("--tokens-per-s", "50", "--kv-per-token", "1MiB",
                                              "--protocol")))
    a.start()
    kv0 = _state(a.port)["kv_bytes"]
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=30)
    body = {"model": "A", "stream": True, "max_tokens": 100_000,      # 2000 s at 50 tokens/s
            "messages": [{"role": "user", "content": "tell me everything"}]}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    words = 0
    while words < 20:                        # read until some tokens came through the front
        line = r.readline()
        assert line, "the stream ended early"
        if line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line:
            words += 1
    st = _state(a.port)
    assert st["in_flight"] == 1 and st["kv_bytes"] > kv0, st      # it is generating, KV grows
    conn.sock.close()                        # the client goes away mid-stream
    conn.close()
    wait_for(lambda: _state(a.port)["in_flight"] == 0, 30, "the engine's request cancelled")
    # Stopped, not paused: over the next second (50 more tokens, 3 KV blocks if it went on)
    # the KV cache does not grow.
    kv_end = _state(a.port)["kv_bytes"]
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        assert _state(a.port)["kv_bytes"] == kv_end
        time.sleep(0.1)
