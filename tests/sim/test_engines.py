"""Real stub engines and the stand-in cuda-checkpoint on one simulated 24 GiB card."""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from berth.driver import PidsGone, UseAtMost, confirm
from berth.sim.cards import sim_uuid

from tests.helpers import openai, wait_for

from .conftest import FREE_DELAY_S, PCI, GiB, MiB, http

CONTEXT = 256 * MiB   # the stub's default --residual, allocated before the weights


@pytest.mark.expect_oom
def test_second_engine_fails_with_simulated_oom(kit):
    first = kit.start(weights="14GiB")
    second = kit.start(weights="14GiB", ready=False)
    assert second.proc.wait(timeout=20) == 1
    assert "CUDA out of memory. Tried to allocate" in second.stderr()
    st = kit.store.read(PCI)
    assert st.oom_events == 1
    r = kit.driver.read(PCI)
    assert set(r.processes) == {first.pid}   # the failed engine freed its partial load on exit
    assert r.free_bytes == 24 * GiB - 14 * GiB - CONTEXT


def test_checkpoint_round_trip_moves_bytes_out_and_back(kit):
    eng = kit.start(weights="4GiB")
    held = 4 * GiB + CONTEXT
    assert kit.state(eng.pid) == "running"
    bps = 8 * GiB
    env = {"BERTH_SIM_CHECKPOINT_BPS": str(bps)}
    t0 = time.monotonic()
    out = kit.checkpoint("--toggle", "--pid", str(eng.pid), env=env)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert took >= held / bps   # a move takes time proportional to the bytes
    assert kit.state(eng.pid) == "checkpointed"
    r = kit.driver.read(PCI)
    assert eng.pid not in r.processes and r.free_bytes == 24 * GiB
    assert eng.healthy()   # CPU threads keep running; only CUDA calls block

    out = kit.checkpoint("--toggle", "--pid", str(eng.pid))
    assert out.returncode == 0, out.stderr
    assert kit.state(eng.pid) == "running"
    r = kit.driver.read(PCI)
    assert r.processes == {eng.pid: held} and r.free_bytes == 24 * GiB - held

    for action, state in (("lock", "locked"), ("checkpoint", "checkpointed"),
                          ("restore", "locked"), ("unlock", "running")):
        out = kit.checkpoint("--action", action, "--pid", str(eng.pid), "--timeout", "5000")
        assert out.returncode == 0, out.stderr
        assert kit.state(eng.pid) == state
    # an illegal edge is CUDA error 401 (an exit status is 8 bits: 401 & 0xFF)
    assert kit.checkpoint("--action", "unlock", "--pid", str(eng.pid)).returncode == 401 & 0xFF
    # a process without simulated CUDA memory
    assert kit.checkpoint("--get-state", "--pid", str(os.getpid())).returncode != 0


@pytest.mark.expect_oom
def test_restore_onto_full_card_fails_and_leaves_process_checkpointed(kit):
    first = kit.start(weights="14GiB")
    assert kit.checkpoint("--toggle", "--pid", str(first.pid)).returncode == 0
    kit.start(weights="14GiB")   # fits now that the first one is in host RAM
    out = kit.checkpoint("--action", "restore", "--pid", str(first.pid))
    assert out.returncode == 2 and "out of memory" in out.stderr
    assert kit.state(first.pid) == "checkpointed"
    assert kit.store.read(PCI).oom_events == 1
    assert first.pid not in kit.driver.read(PCI).processes
    # stuck, as cuda-checkpoint#44 reports: later restores 304, unlock 401
    assert kit.checkpoint("--action", "restore", "--pid", str(first.pid)).returncode == 304 & 0xFF
    assert kit.checkpoint("--action", "unlock", "--pid", str(first.pid)).returncode == 401 & 0xFF
    assert kit.checkpoint("--toggle", "--pid", str(first.pid)).returncode == 304 & 0xFF


def test_confirm_sees_killed_engine_free_only_after_exit_delay(kit):
    eng = kit.start(weights="4GiB")
    before = kit.driver.read(PCI)
    assert eng.pid in before.processes
    eng.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    r = asyncio.run(confirm(kit.driver, PCI, PidsGone(frozenset({eng.pid})),
                            deadline=killed_at + 10, event_at=killed_at))
    assert r is not None, "the killed engine's memory never went free"
    assert r.at - killed_at >= FREE_DELAY_S
    assert r.free_bytes == 24 * GiB
    eng.proc.wait(timeout=5)


def test_streaming_chat_with_openai_client(kit):
    eng = kit.start("--model", "stub-7b", weights="2GiB")
    client = openai.OpenAI(base_url=eng.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    assert [m.id for m in client.models.list()] == ["stub-7b"]
    stream = client.chat.completions.create(
        model="stub-7b", messages=[{"role": "user", "content": "say something"}],
        max_tokens=8, stream=True)
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert len("".join(parts).split()) == 8 and finish == "length"
    done = client.chat.completions.create(
        model="stub-7b", messages=[{"role": "user", "content": "again"}], max_tokens=3)
    assert len(done.choices[0].message.content.split()) == 3
    assert done.usage.completion_tokens == 3


def test_kv_cache_grows_and_stays_as_a_high_water_mark(kit):
    eng = kit.start("--kv-per-token", "1MiB", weights="1GiB")
    base = kit.driver.read(PCI).processes[eng.pid]
    status, body = http("POST", eng.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "one two"}], "max_tokens": 40})
    assert status == 200, body
    grown = kit.driver.read(PCI).processes[eng.pid]
    assert grown - base >= 42 * MiB   # 2 prompt + 40 generated tokens, in 16-token blocks
    status, body = http("POST", eng.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "short"}], "max_tokens": 4})
    assert status == 200 and kit.driver.read(PCI).processes[eng.pid] == grown
    status, body = http("POST", eng.url + "/v1/chat/completions", b"{not json")
    assert status == 400 and "body" in body["error"]["message"]
    status, body = http("POST", eng.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})
    assert status == 400 and "max_tokens" in body["error"]["message"]


def _stream_lines(url: str, body: bytes, out: queue.Queue) -> None:
    """Put ``(arrival time, data)`` for every SSE line, then ``(time, None)`` at the end."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r:
            if line.startswith(b"data: "):
                out.put((time.monotonic(), line[6:].strip()))
    out.put((time.monotonic(), None))


def test_checkpointed_engine_blocks_in_flight_generation_and_resumes(kit):
    eng = kit.start("--tokens-per-s", "100", weights="2GiB")
    chunks: queue.Queue = queue.Queue()
    # 400 tokens at 100 per second: the stream lasts 4 s, so the checkpoint tool (a process of
    # its own, slow to start on a loaded machine) lands inside it
    body = b'{"messages":[{"role":"user","content":"go"}],"max_tokens":400,"stream":true}'
    reader = threading.Thread(target=_stream_lines, daemon=True,
                              args=(eng.url + "/v1/chat/completions", body, chunks))
    reader.start()
    for _ in range(4):   # the role chunk and three tokens
        assert chunks.get(timeout=10)[1] is not None
    assert kit.checkpoint("--toggle", "--pid", str(eng.pid)).returncode == 0
    checkpointed_at = time.monotonic()
    assert kit.state(eng.pid) == "checkpointed"
    # drain what was generated before the lock (until a second passes with nothing: a loaded
    # machine may hold a chunk that long); one step that passed the gate may still land
    late = 0
    while True:
        try:
            at, item = chunks.get(timeout=1.0)
        except queue.Empty:
            break
        assert item is not None, "the stream ended while the engine was checkpointed"
        late += at > checkpointed_at
    assert late <= 1
    with pytest.raises(queue.Empty):   # a checkpointed engine generates nothing
        chunks.get(timeout=0.5)
    assert kit.checkpoint("--toggle", "--pid", str(eng.pid)).returncode == 0
    assert chunks.get(timeout=30)[1] is not None   # generation resumes after restore
    items = []
    while (item := chunks.get(timeout=10)[1]) is not None:
        items.append(item)
    assert items[-1] == b"[DONE]"
    reader.join(timeout=30)


def test_protocol_park_wake_lend_return(kit):
    eng = kit.start("--protocol", "--lend", "--kv-pool", "2GiB", weights="8GiB")
    full = CONTEXT + 8 * GiB + 2 * GiB
    assert kit.driver.read(PCI).processes[eng.pid] == full
    assert http("GET", eng.url + "/berth/v1/state") == (200, {
        "state": "active", "lent": {}, "held_bytes": full, "weights_bytes": 8 * GiB,
        "kv_bytes": 2 * GiB, "in_flight": 0})

    status, body = http("POST", eng.url + "/berth/v1/lend", {"card": PCI, "bytes": GiB})
    assert status == 200 and body["state"] == "lent" and body["lent"] == {PCI: GiB}
    r = asyncio.run(confirm(kit.driver, PCI, UseAtMost(frozenset({eng.pid}), full - GiB),
                            deadline=time.monotonic() + 5))
    assert r is not None
    status, body = http("POST", eng.url + "/berth/v1/park", b"")
    assert status == 409   # a share is never parked and lending at once
    status, body = http("POST", eng.url + "/berth/v1/return", {"card": PCI, "bytes": GiB})
    assert status == 200 and body["state"] == "active"
    assert kit.driver.read(PCI).processes[eng.pid] == full

    status, body = http("POST", eng.url + "/berth/v1/park", b"")
    assert status == 200 and body["state"] == "parked"
    assert kit.driver.read(PCI).processes[eng.pid] == CONTEXT   # the residual stays
    status, body = http("POST", eng.url + "/berth/v1/wake", b"")
    assert status == 200 and body["state"] == "active"
    assert kit.driver.read(PCI).processes[eng.pid] == full
    # a request that reaches a parked engine around Berth loads it again ("unparked")
    assert http("POST", eng.url + "/berth/v1/park", b"")[0] == 200
    status, body = http("POST", eng.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
    assert status == 200 and http("GET", eng.url + "/berth/v1/state")[1]["state"] == "active"
    assert kit.driver.read(PCI).processes[eng.pid] == full

    for path, bad in (("lend", b"[1]"), ("lend", {"card": "nowhere", "bytes": 1}),
                      ("lend", {"card": PCI, "bytes": 0}), ("return", {"card": PCI, "bytes": 5}),
                      ("lend", {"card": "0000:02:00.0", "bytes": 1}), ("park", b"{oops")):
        status, body = http("POST", eng.url + "/berth/v1/" + path, bad)
        assert status == 400, (path, bad, body)
        assert body["error"]["code"] == 400 and body["error"]["message"]


def test_protocol_test_knobs_park_noop_and_wake_hang(kit):
    eng = kit.start("--protocol", "--park-noop", "--wake-hang", weights="4GiB")
    held = kit.driver.read(PCI).processes[eng.pid]
    status, body = http("POST", eng.url + "/berth/v1/park", b"")
    assert status == 200 and body["state"] == "parked"
    assert kit.driver.read(PCI).processes[eng.pid] == held   # acknowledged, nothing freed
    with pytest.raises(TimeoutError):   # --wake-hang: the wake never answers
        http("POST", eng.url + "/berth/v1/wake", b"", timeout_s=0.5)
    wait_for(lambda: eng.proc.poll() is None and eng.healthy(), what="engine still serving")


def test_load_hold_test_knob_holds_a_load_until_its_file_is_gone(kit, tmp_path):
    """``--load-hold PATH``: while PATH exists the load has its memory on the card but does not
    finish (``/health`` 503, a chat 503 "Loading model"); it finishes once PATH is removed.
    Without the file the knob changes nothing."""
    hold = tmp_path / "hold"
    hold.touch()
    eng = kit.start("--load-hold", str(hold), weights="4GiB", ready=False)
    wait_for(lambda: "(--load-hold)" in eng.stderr(), what="the load held")
    assert kit.driver.read(PCI).processes[eng.pid] == 4 * GiB + CONTEXT   # weights all loaded
    assert not eng.healthy()
    status, body = http("POST", eng.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 503 and body["error"]["message"] == "Loading model", body
    hold.unlink()
    wait_for(eng.healthy, what="the load finished once the hold file was gone")
    assert kit.driver.read(PCI).processes[eng.pid] == 4 * GiB + CONTEXT
    free = kit.start("--load-hold", str(hold), weights="1GiB")   # no file: loads at once
    assert "(--load-hold)" not in free.stderr()


def test_token_hold_test_knob_holds_a_request_after_its_first_token(kit, tmp_path):
    """``--token-hold PATH``: while PATH exists a request stops after its first token (a second
    request gets its own first token meanwhile, where at 500 tokens/s the first would have
    ended); both end once PATH is removed."""
    hold = tmp_path / "hold"
    hold.touch()
    eng = kit.start("--token-hold", str(hold), weights="1GiB")
    client = openai.OpenAI(base_url=eng.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    got: list[list[str]] = [[], []]
    finish: list[str | None] = [None, None]

    def stream(k: int) -> None:
        for chunk in client.chat.completions.create(
                model="stub", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
                stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got[k].append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish[k] = chunk.choices[0].finish_reason

    threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in (0, 1)]
    threads[0].start()
    wait_for(lambda: got[0], what="the first request's first token")
    threads[1].start()
    wait_for(lambda: got[1], what="the second request's first token")
    assert len(got[0]) == 1 and len(got[1]) == 1, got      # both held after their first
    hold.unlink()
    for t in threads:
        t.join(30)
    assert [len(g) for g in got] == [20, 20] and finish == ["length", "length"], (got, finish)


def test_restore_hold_test_knob_holds_a_restore_until_its_file_is_gone(kit, tmp_path):
    """``$BERTH_SIM_RESTORE_HOLD=PATH``: a restore has taken its memory back (the process is
    ``locked``) but does not finish while PATH exists; it exits 0 once PATH is removed."""
    eng = kit.start(weights="2GiB")
    for action in ("lock", "checkpoint"):
        assert kit.checkpoint("--action", action, "--pid", str(eng.pid)).returncode == 0
    hold = tmp_path / "hold"
    hold.touch()
    restore = subprocess.Popen(
        [sys.executable, "-m", "berth.sim.checkpoint", "--action", "restore", "--pid",
         str(eng.pid)], env=dict(kit.env, BERTH_SIM_RESTORE_HOLD=str(hold)))
    try:
        wait_for(lambda: kit.state(eng.pid) == "locked", what="the restore's memory taken")
        assert kit.driver.read(PCI).processes[eng.pid] == 2 * GiB + CONTEXT
        assert restore.poll() is None, "the restore finished while held"
        hold.unlink()
        assert restore.wait(timeout=30) == 0
    finally:
        restore.kill()
        restore.wait()


def test_checkpoint_test_knobs_hang_and_not_supported(kit):
    eng = kit.start(weights="1GiB")
    with pytest.raises(subprocess.TimeoutExpired):   # the caller's timeout fires first
        subprocess.run(
            [sys.executable, "-m", "berth.sim.checkpoint", "--toggle", "--pid", str(eng.pid)],
            env=dict(kit.env, BERTH_SIM_CHECKPOINT_HANG_S="30"), timeout=0.5)
    assert kit.state(eng.pid) == "running"
    assert kit.checkpoint("--action", "lock", "--pid", str(eng.pid)).returncode == 0
    out = kit.checkpoint("--action", "checkpoint", "--pid", str(eng.pid),
                         env={"BERTH_SIM_CHECKPOINT_UNSUPPORTED": "1"})
    assert out.returncode == 801 & 0xFF and "not supported" in out.stderr
    assert kit.state(eng.pid) == "locked"
    assert kit.checkpoint("--action", "unlock", "--pid", str(eng.pid)).returncode == 0


def test_engine_finds_its_card_through_cuda_visible_devices_and_frees_on_sigterm(kit):
    eng = kit.start("--protocol", "--tokens-per-s", "500", weights="3GiB", card=None,
                    env={"CUDA_VISIBLE_DEVICES": sim_uuid(PCI)})
    assert kit.driver.read(PCI).processes == {eng.pid: 3 * GiB + CONTEXT}
    # a client that goes away cancels its generation
    conn = httpclient.HTTPConnection("127.0.0.1", eng.port, timeout=10)
    conn.request("POST", "/v1/chat/completions",
                 b'{"messages":[{"role":"user","content":"go"}],"max_tokens":100000,"stream":true}',
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    assert http("GET", eng.url + "/berth/v1/state")[1]["in_flight"] == 1
    conn.close()
    wait_for(lambda: http("GET", eng.url + "/berth/v1/state")[1]["in_flight"] == 0,
         timeout_s=30, what="the abandoned generation to stop")
    eng.proc.send_signal(signal.SIGTERM)
    assert eng.proc.wait(timeout=10) == 0
    assert kit.driver.read(PCI).free_bytes == 24 * GiB   # freed by the engine itself, at once


def test_crash_on_term_leaves_the_free_to_the_driver_after_the_exit_and_the_delay(kit):
    """Issue 12: a stub that stops as a crashed engine does. Its memory is still counted after
    it has exited, and goes only ``free_delay_s`` after a reader first sees it gone; a plain
    stub beside it frees its own at once on SIGTERM."""
    crash = kit.start("--crash-on-term", weights="4GiB")
    plain = kit.start(weights="2GiB")
    assert kit.driver.read(PCI).processes == {crash.pid: 4 * GiB + CONTEXT,
                                              plain.pid: 2 * GiB + CONTEXT}
    crash.proc.send_signal(signal.SIGTERM)
    assert crash.proc.wait(timeout=10) == -signal.SIGTERM     # died by the signal
    gone_at = time.monotonic()
    first = kit.driver.read(PCI)          # this read sees it gone: the delay starts now
    assert first.processes.get(crash.pid) == 4 * GiB + CONTEXT, first.processes
    assert "without freeing (--crash-on-term)" in crash.stderr()
    wait_for(lambda: crash.pid not in kit.driver.read(PCI).processes, timeout_s=30,
         what="the driver to free the crashed engine's memory")
    assert time.monotonic() - gone_at >= FREE_DELAY_S
    plain.proc.send_signal(signal.SIGTERM)
    assert plain.proc.wait(timeout=10) == 0
    assert kit.driver.read(PCI).free_bytes == 24 * GiB     # freed by the engine itself, at once


def test_parallel_slots_queue_the_rest_and_props_says_how_many(kit):
    """``--parallel N`` (llama-server's flag, issue 34): N requests run at once, the rest wait in
    the engine's queue in arrival order, and ``GET /props`` says ``total_slots`` as llama-server's
    does; without it there is no ``/props`` (Berth's front then forwards every request)."""
    plain = kit.start(weights="1GiB")
    assert http("GET", plain.url + "/props")[0] == 404
    eng = kit.start("--parallel", "1", "--tokens-per-s", "20", "--protocol", weights="1GiB")
    assert http("GET", eng.url + "/props") == (200, {"total_slots": 1, "model_alias": "stub"})
    ends: list[str] = []

    def chat(name: str, tokens: int) -> None:
        body = {"model": "stub", "max_tokens": tokens,
                "messages": [{"role": "user", "content": name}]}
        assert http("POST", eng.url + "/v1/chat/completions", body, timeout_s=60)[0] == 200
        ends.append(name)

    def in_flight() -> int:
        return http("GET", eng.url + "/berth/v1/state")[1]["in_flight"]
    threads = [threading.Thread(target=chat, args=("long", 40))]       # 2 s in its slot
    threads[0].start()
    wait_for(lambda: in_flight() == 1, 10, "the long request in its slot")
    threads.append(threading.Thread(target=chat, args=("short", 1)))   # 50 ms, after it
    threads[1].start()
    wait_for(lambda: in_flight() == 2, 10, "the short request queued")
    for t in threads:
        t.join(30)
    assert ends == ["long", "short"], ends


def test_a_deeply_nested_body_is_a_400_naming_the_body_not_a_500(kit):
    # A fuzzer's favourite: json.loads raises RecursionError (not a ValueError) past ~1,000
    # levels, which reached aiohttp as a 500 and a traceback in the engine's log.
    eng = kit.start(weights="1GiB")
    deep = b"[" * 100_000 + b"]" * 100_000
    code, body = http("POST", eng.url + "/v1/chat/completions", deep)
    assert code == 400 and body["error"]["message"].startswith("body: ")
    assert "Traceback" not in eng.stderr()
    code, _ = http("GET", eng.url + "/health")
    assert code == 200


def _chat_raw(url: str, out: list) -> None:
    """One chat; append ``(status, body bytes)`` (a body that is not JSON included)."""
    req = urllib.request.Request(url + "/v1/chat/completions", headers={
        "Content-Type": "application/json"},
        data=b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}')
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out.append((r.status, r.read()))
    except urllib.error.HTTPError as e:
        out.append((e.code, e.read()))


def test_requests_in_flight_when_the_engine_stops_are_503s_not_500s(kit):
    """Two chats wait on a locked engine (the first for the card, the second for the engine's
    memory lock behind it); SIGTERM ends both with the engine's 503 "shutting down". The second
    went on to grow its KV cache on an engine already shutting down, and the store's SimError
    reached aiohttp: a plain-text 500 and a traceback (issue 38: a 500 in the soak)."""
    eng = kit.start("--protocol", weights="1GiB")
    assert kit.checkpoint("--action", "lock", "--pid", str(eng.pid)).returncode == 0
    answers: list = []
    chats = [threading.Thread(target=_chat_raw, args=(eng.url, answers), daemon=True)
             for _ in range(2)]
    for t in chats:
        t.start()
    wait_for(lambda: http("GET", eng.url + "/berth/v1/state")[1]["in_flight"] == 2,
             timeout_s=20, what="both chats in the engine")
    eng.proc.send_signal(signal.SIGTERM)
    for t in chats:
        t.join(30)
    assert eng.proc.wait(timeout=20) == 0
    assert [code for code, _ in answers] == [503, 503], (answers, eng.stderr())
    for _, body in answers:
        assert "shutting down" in json.loads(body)["error"]["message"], body
    assert "Traceback" not in eng.stderr()
