"""The front's states (seed 002 "Fronts"): what a read and a write get in each, holding, waking,
draining, and the 503 that ends a held request."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from berth.front import EDGES, TRANSITIONS, FrontState, IllegalFrontTransition

from tests.helpers import openai

from .conftest import Upstream, front_for, json_handler, run, sse_handler, until

F = FrontState


def check_503(body: dict, reason: str) -> None:
    assert body["src"] == "berth" and body["reason"] == reason
    assert body["error"]["type"] == "unavailable_error" and body["error"]["code"] == 503
    assert body["error"]["message"]


def test_transition_table_is_data_and_every_state_can_stop():
    assert set(TRANSITIONS) == set(FrontState)
    assert all(F.STOPPED in TRANSITIONS[s] for s in FrontState if s is not F.STOPPED)
    assert TRANSITIONS[F.OPEN] == {F.CLOSING, F.STOPPED}   # an engine sleeps only after a drain
    assert all(label for label in EDGES.values())


@run
async def test_illegal_transitions_raise_and_self_moves_do_nothing():
    async with Upstream() as up, front_for(up) as front:
        with pytest.raises(IllegalFrontTransition, match="open -> asleep"):
            front.sleep()   # not without a drain first
        assert front.state is F.OPEN and front.open() is False
        assert await front.close_and_drain(1.0) is True and front.sleep() is True
        assert front.sleep() is False
        with pytest.raises(IllegalFrontTransition, match="asleep -> starting"):
            front.starting()
        assert front.waking() is True and front.open() is True
        front.stopped()
        with pytest.raises(IllegalFrontTransition):
            front.open()
        assert await front.close_and_drain(1.0) is True and front.state is F.STOPPED
        assert front.starting() is True and front.state is F.STARTING


@pytest.mark.parametrize("state", ["starting", "closing", "asleep", "waking", "stopped"])
def test_a_read_is_answered_503_at_once_while_not_open(state: str):
    @run
    async def scenario():
        wakes: list[int] = []

        async def on_wake() -> None:
            wakes.append(1)

        async with Upstream() as up, front_for(up, state=state, on_wake=on_wake) as front, \
                aiohttp.ClientSession() as s:
            up.route("GET", "/health", json_handler({"status": "ok"}))
            for method in ("GET", "HEAD", "OPTIONS"):
                async with s.request(method, front.url + "/health") as r:
                    assert r.status == 503 and r.headers["Retry-After"]
                    if method != "HEAD":
                        body = await r.json()
                        check_503(body, state)
                        assert state in body["error"]["message"]
            assert wakes == [] and up.seen == [] and front.state == state
            assert front.refused_reads == 3
    scenario()


@run
async def test_open_forwards_reads_including_health():
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("GET", "/health", json_handler({"status": "ok"}))
        async with s.get(front.url + "/health") as r:
            assert r.status == 200 and await r.json() == {"status": "ok"}


@run
async def test_asleep_a_get_never_wakes_but_a_post_does_and_is_answered_after_the_wake():
    woke = asyncio.Event()

    async def on_wake() -> None:
        woke.set()

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front, \
            aiohttp.ClientSession() as s:
        up.route("POST", "/v1/completions", json_handler({"text": "hi"}))
        async with s.get(front.url + "/v1/models") as r:
            assert r.status == 503
            body = await r.json()
        check_503(body, "asleep")
        assert "asleep" in body["error"]["message"] and not woke.is_set()
        assert front.state is F.ASLEEP and front.wakes == 0

        post = asyncio.create_task(s.post(front.url + "/v1/completions", json={"prompt": "x"}))
        await asyncio.wait_for(woke.wait(), 5)
        assert front.state is F.WAKING and front.wakes == 1
        await until(lambda: front.holding == 1, "the post to be held")
        assert up.seen == []   # nothing reached the sleeping engine
        # a second write while waking does not ask again
        second = asyncio.create_task(s.post(front.url + "/v1/completions", json={}))
        await until(lambda: front.holding == 2, "the second post to be held")
        front.open()   # the wake answered
        for task in (post, second):
            async with await task as r:
                assert r.status == 200 and await r.json() == {"text": "hi"}
        assert front.wakes == 1 and front.held == 2 and front.forwarded == 2


@run
async def test_on_wake_may_open_the_front_itself():
    async def on_wake() -> None:
        front.open()

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front:
        up.route("POST", "/v1/chat/completions", sse_handler(up, n=3))
        up.release.set()

        def chat() -> str:
            client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
            stream = client.chat.completions.create(model="m", messages=[], stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream)

        assert await asyncio.to_thread(chat) == "t0 t1 t2 "
        assert front.state is F.OPEN and front.wakes == 1


@run
async def test_starting_holds_a_write_until_open_without_asking_for_a_wake():
    wakes: list[int] = []

    async def on_wake() -> None:
        wakes.append(1)

    async with Upstream() as up, front_for(None, state="starting", on_wake=on_wake) as front, \
            aiohttp.ClientSession() as s:
        up.route("POST", "/v1/completions", json_handler({"text": "late"}))
        post = asyncio.create_task(s.post(front.url + "/v1/completions", json={}))
        await until(lambda: front.holding == 1, "the post to be held")
        front.set_upstream(up.url)
        front.open()
        async with await post as r:
            assert r.status == 200 and await r.json() == {"text": "late"}
        assert wakes == []


@run
async def test_held_request_ends_at_the_wait_limit():
    async with Upstream() as up, front_for(up, state="starting", wait_limit_s=0.3) as front, \
            aiohttp.ClientSession() as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with s.post(front.url + "/v1/completions", json={}) as r:
            took = loop.time() - t0
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            body = await r.json()
        check_503(body, "wait_limit")
        assert 0.3 <= took < 5.0            # the 0.3 s wait limit, on a loaded machine too
        assert front.held == 1 and front.held_timeouts == 1 and front.holding == 0
        assert up.seen == []


@pytest.mark.parametrize("header", ["X-Stainless-Timeout", "X-Stainless-Read-Timeout",
                                    "X-Berth-Deadline", "X-Request-Timeout"])
def test_held_request_ends_at_the_clients_own_deadline(header: str):
    @run
    async def scenario():
        async with front_for(None, state="starting", wait_limit_s=30) as front, \
                aiohttp.ClientSession() as s:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            async with s.post(front.url + "/v1/completions", json={},
                              headers={header: "0.4"}) as r:
                took = loop.time() - t0
                assert r.status == 503
                check_503(await r.json(), "client_deadline")
            assert 0.2 <= took < 5.0   # answered just before the client's 0.4 s (not at 30 s)
            assert front.held_timeouts == 1
    scenario()


@run
async def test_openai_client_gets_the_503_before_its_own_timeout():
    async with front_for(None, state="starting", wait_limit_s=30) as front:
        def chat() -> openai.APIStatusError:
            client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0,
                                   timeout=0.5)
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(model="m", messages=[])
            return info.value

        err = await asyncio.to_thread(chat)
        assert err.status_code == 503
        assert err.body["message"] and "not ready" in err.body["message"]
        assert err.response.json()["reason"] == "client_deadline"


@run
async def test_wake_failure_answers_held_requests_with_the_reason():
    async def on_wake() -> None:
        raise RuntimeError("no room on gpu0")

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front, \
            aiohttp.ClientSession() as s:
        async with s.post(front.url + "/v1/completions", json={}) as r:
            assert r.status == 503
            check_503(await r.json(), "wake failed: no room on gpu0")
        assert front.state is F.ASLEEP and front.wakes == 1
        # the next write asks again
        async with s.post(front.url + "/v1/completions", json={}) as r:
            assert r.status == 503
        assert front.wakes == 2


@run
async def test_fail_held_and_stopped_answer_held_requests_now():
    async with Upstream() as up, front_for(up, state="asleep") as front, \
            aiohttp.ClientSession() as s:   # no on_wake: requests just wait
        post = asyncio.create_task(s.post(front.url + "/x", json={}))
        await until(lambda: front.holding == 1, "the post to be held")
        assert front.fail_held("engine restarting") == 1
        async with await post as r:
            assert r.status == 503
            check_503(await r.json(), "engine restarting")
        assert front.state is F.ASLEEP

        post = asyncio.create_task(s.post(front.url + "/x", json={}))
        await until(lambda: front.holding == 1, "the post to be held")
        front.stopped("engine stopped")
        async with await post as r:
            check_503(await r.json(), "engine stopped")
        async with s.post(front.url + "/x", json={}) as r:   # new writes are refused at once
            assert r.status == 503
            check_503(await r.json(), "engine stopped")
        assert front.held_timeouts == 0 and front.holding == 0


@run
async def test_close_and_drain_waits_for_an_in_flight_stream():
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", sse_handler(up, n=3))
        up.route("POST", "/v1/completions", json_handler({"after": True}))
        stream = await s.post(front.url + "/v1/chat/completions", json={})
        await stream.content.readuntil(b"\n\n")
        assert front.in_flight == 1
        assert await front.close_and_drain(0.2) is False   # the stream is still going
        assert front.state is F.CLOSING

        held = asyncio.create_task(s.post(front.url + "/v1/completions", json={}))
        await until(lambda: front.holding == 1, "a new write to be held while closing")
        async with s.get(front.url + "/v1/models") as r:
            check_503(await r.json(), "closing")

        drain = asyncio.create_task(front.close_and_drain(5.0))
        await until(lambda: front.holding == 1 and not drain.done(), "the drain to wait")
        up.release.set()
        rest = await stream.read()
        stream.release()
        assert rest.endswith(b"data: [DONE]\n\n")
        assert await drain is True and front.in_flight == 0
        assert len(up.seen) == 1   # the held write never reached the engine

        front.open()   # the park was called off: the held write goes through
        async with await held as r:
            assert await r.json() == {"after": True}


@run
async def test_client_that_leaves_while_held_is_counted_and_forgotten():
    async with Upstream() as up, front_for(up, state="starting") as front:
        async with aiohttp.ClientSession() as s:
            post = asyncio.create_task(s.post(front.url + "/v1/completions", json={}))
            await until(lambda: front.holding == 1, "the post to be held")
            post.cancel()
            with pytest.raises(asyncio.CancelledError):
                await post
        await until(lambda: front.client_gone == 1, "the front to see the client leave")
        assert front.holding == 0 and front.held_timeouts == 0
        front.open()
        assert up.seen == []


@run
async def test_stop_answers_held_requests():
    async with Upstream() as up, aiohttp.ClientSession() as s:
        async with front_for(up, state="starting") as front:
            post = asyncio.create_task(s.post(front.url + "/x", json={}))
            await until(lambda: front.holding == 1, "the post to be held")
            stop = asyncio.create_task(front.stop())
            async with await post as r:
                check_503(await r.json(), "front stopped")
            await stop
            assert front.state is F.STOPPED


@run
async def test_is_write_decides_what_may_wake_the_engine():
    wakes: list[int] = []

    async def on_wake() -> None:
        wakes.append(1)

    def is_write(method: str, path: str) -> bool:   # like ComfyUI: clearing the queue is no GPU work
        return method not in ("GET", "HEAD", "OPTIONS") and path != "/queue"

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake,
                                          is_write=is_write) as front, \
            aiohttp.ClientSession() as s:
        async with s.post(front.url + "/queue", json={"clear": True}) as r:
            assert r.status == 503
            check_503(await r.json(), "asleep")
        assert wakes == [] and front.state is F.ASLEEP
        front.open()   # woken by the broker with nothing held
        up.route("POST", "/queue", json_handler({"cleared": True}))
        async with s.post(front.url + "/queue", json={"clear": True}) as r:
            assert r.status == 200   # open: everything is forwarded


@run
async def test_expect_100_continue_body_is_sent_once_the_front_forwards():
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=up.seen[-1][3])

    async with Upstream() as up, front_for(up, state="starting") as front, \
            aiohttp.ClientSession() as s:
        up.route("POST", "/v1/completions", echo)
        post = asyncio.create_task(s.post(front.url + "/v1/completions", data=b"x" * 5000,
                                          expect100=True))
        await until(lambda: front.holding == 1, "the post to be held")
        front.open()
        async with await post as r:
            assert r.status == 200 and await r.read() == b"x" * 5000
        assert "Expect" not in up.seen[0][2]


@run
async def test_an_asleep_front_says_100_continue_and_wakes_once_the_body_is_in():
    # The wake waits for the body (a malformed one wakes nothing), and a client that expects
    # 100 Continue sends it only then: the front says it while it holds the request, once.
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=up.seen[-1][3])
    wakes: list[int] = []

    async def on_wake() -> None:
        wakes.append(len(front._line[0].parts) if front._line else -1)
        front.open()

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front:
        up.route("POST", "/v1/completions", echo)
        r, w = await asyncio.open_connection("127.0.0.1", front.port)
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                b"Expect: 100-continue\r\n\r\n")
        assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        assert wakes == [] and front.state is F.ASLEEP
        w.write(b"x" * 5000)
        head = await r.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head        # no second 100 before it
        assert await r.readexactly(5000) == b"x" * 5000
        assert wakes and wakes[0] > 0, wakes                 # the body was in when it woke
        w.close()


@run
async def test_a_held_write_nested_too_deep_to_parse_is_still_held_and_forwarded():
    # `"stream"` in a body makes the front parse it (does the client want an event stream?);
    # json.loads raises RecursionError past ~1,000 levels, which cut the connection with no
    # answer and a traceback in the run's log. The engine is the one to judge the body.
    async def on_wake() -> None:
        front.open()

    deep = b'{"stream": true, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front, \
            aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", json_handler({"error": "nested"}, status=400))
        async with s.post(front.url + "/v1/chat/completions", data=deep,
                          headers={"Content-Type": "application/json",
                                   "X-Berth-Loading-State": "true"}) as r:
            assert r.status == 400 and await r.json() == {"error": "nested"}
        assert front.wakes == 1 and up.seen[0][3] == deep


@pytest.mark.parametrize("value", ["abc", "30s", "-1", "nan"])
def test_a_malformed_berth_deadline_is_a_400_and_wakes_nothing(value: str):
    """``X-Berth-Deadline: 30s`` (a duration as berth.toml writes one) was ignored: the request
    counted as patient and waited up to the wait limit, and it woke the engine. It is a 400 that
    names the header and its value, and the engine stays asleep."""
    wakes: list[int] = []

    async def on_wake() -> None:
        wakes.append(1)

    @run
    async def scenario():
        async with Upstream() as up, front_for(up, state="asleep", wait_limit_s=30,
                                               on_wake=on_wake) as front, \
                aiohttp.ClientSession() as s:
            async with s.post(front.url + "/v1/completions", json={},
                              headers={"X-Berth-Deadline": value}) as r:
                assert r.status == 400
                text = (await r.json())["error"]["message"]
            assert "X-Berth-Deadline" in text and repr(value) in text, text
            assert wakes == [] and front.held == 0
    scenario()


@pytest.mark.parametrize("value", ["30s", "abc"])
def test_a_malformed_berth_deadline_is_a_400_while_the_engine_serves_too(value: str):
    """The header was checked only when the front held the request: while the engine served,
    ``X-Berth-Deadline: 30s`` went to it unremarked, so a client's mistake showed only once its
    engine slept. The llama-swap guide says any value but seconds is a 400: in every state."""
    @run
    async def scenario():
        async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
            up.route("POST", "/v1/completions", json_handler({"ok": True}))
            async with s.post(front.url + "/v1/completions", json={},
                              headers={"X-Berth-Deadline": value}) as r:
                assert r.status == 400
                text = (await r.json())["error"]["message"]
            assert "X-Berth-Deadline" in text and repr(value) in text, text
            assert up.seen == [] and front.state is F.OPEN
            async with s.post(front.url + "/v1/completions", json={},
                              headers={"X-Berth-Deadline": "30"}) as r:
                assert r.status == 200 and await r.json() == {"ok": True}
    scenario()


@run
async def test_a_lasting_no_room_503_asks_for_a_longer_retry():
    """A wait nothing under way can end (a higher-priority holder) is a 503 whose Retry-After is
    :data:`RETRY_LASTING_S`, not the 1 s of a passing one: a client retrying every second on
    a lasting cause only loops (a new user's report)."""
    from berth.front.rules import RETRY_AFTER_S, RETRY_LASTING_S
    async with Upstream() as up, front_for(up, state="asleep") as front, \
            aiohttp.ClientSession() as s:
        front.set_cause("gpu0 is held by x (priority 9)", lasting=True)
        async with s.post(front.url + "/v1/completions", json={}) as r:
            assert r.status == 503
            check_503(await r.json(), "no_room")
            assert r.headers["Retry-After"] == str(RETRY_LASTING_S)
        front.set_cause("gpu0 is being parked for x")     # passing: the next try may pass
        post = asyncio.create_task(s.post(front.url + "/x", json={}))
        await until(lambda: front.holding == 1, "the post to be held")
        front.fail_held("engine restarting")
        async with await post as r:
            assert r.headers["Retry-After"] == str(RETRY_AFTER_S) == "1"
