"""``berth run`` as llama-swap's ``cmd`` (issue 5; seed 002 "Fronts", stage A1): two 14 GiB models
on one simulated 24 GiB card, alternating streamed chats from a real OpenAI client; llama-swap's
stop (SIGTERM to the group, SIGKILL after the 10 s unloadTimeout); ``kill -9`` of the run."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading

import psutil
import pytest

from tests.helpers import ours, wait_for
from tests.run.llamaswap import UNLOAD_TIMEOUT_S
from tests.run.world import GiB, chat, run_cmd

MAX_TOKENS = 8


def _since(d, seq: int) -> list[dict]:
    return [e for e in d.timeline() if e["seq"] > seq]


def _last_seq(d) -> int:
    return max((e["seq"] for e in d.timeline()), default=0)


def _first(entries: list[dict], engine: str, kind: str, text: str = "") -> dict:
    found = [e for e in entries if e["engine"] == engine and e["kind"] == kind and text in e["text"]]
    assert found, f"no {kind!r} entry for {engine} containing {text!r} in {entries}"
    return found[0]


@pytest.mark.early(30)
def test_two_models_alternate_on_one_card_every_chat_answered_idle_one_parked(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    b = world.model("B", run_cmd("B"))
    a.start()
    assert d.state_of("A") == "active"
    b.start()                           # B's grant needs A's room: A was parked first
    assert d.state_of("B") == "active" and d.state_of("A") == "parked"
    seq = _last_seq(d)
    for target, idle in (("A", "B"), ("B", "A"), ("A", "B"), ("B", "A"), ("A", "B")):
        port = a.port if target == "A" else b.port
        ans = chat(port, target, max_tokens=MAX_TOKENS)
        assert ans.content_chunks == MAX_TOKENS and ans.finish_reason == "length", ans
        # The target was woken only after the idle one's park was confirmed by a driver read,
        # so the idle one is parked the moment the answer is complete. The target's share turns
        # active on the run's report, sent as its front opens (possibly after a short answer).
        assert d.state_of(idle) == "parked"
        wait_for(lambda target=target: d.state_of(target) == "active", 30,
                 f"{target}'s wake reported")
        new = _since(d, seq)
        park = _first(new, idle, "park", "parks by checkpoint")
        parked = _first(new, idle, "parked")
        resume = _first(new, target, "resume")
        woke = _first(new, target, "wake", "woke")
        assert park["seq"] < parked["seq"] < resume["seq"] < woke["seq"], new
        seq = max(e["seq"] for e in new)
    snap = world.sim()
    assert [c.oom_events for c in snap.cards] == [0]
    assert d.status()["counters"]["checkpoints"] == 6 and d.status()["counters"]["wakes"] == 5
    for m in (a, b):
        st = m.stop()
        assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st
    wait_for(lambda: d.status()["leases"] == [], 30, "both leases ended")


def test_llama_swap_stop_ends_within_unload_timeout_and_logs_the_engines_exit_code(world):
    """A run stopped by SIGTERM exits 0 whatever its engine did (main.py step 5: one code per
    signal in every state); an engine that exits 3 on SIGTERM has its code in the run's log;
    one that ignores SIGTERM is the worst case: the run must SIGKILL it, and still exit before
    llama-swap would."""
    d = world.start_berthd()
    exit3 = world.model("X3", run_cmd("X3", size="1GiB", park=False,
                                      engine_argv=_engine("exit", "3")))
    stubborn = world.model("XT", run_cmd("XT", size="1GiB", park=False,
                                         engine_argv=_engine("ignore", "0")))
    exit3.start()
    stubborn.start()
    pid3, pidt = world.engine_pid("X3"), world.engine_pid("XT")
    st = exit3.stop()
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st
    assert "X3 stopped with exit code 3; the run exits 0 (stopped by SIGTERM)" in \
        world.log("X3"), world.log("X3")
    st = stubborn.stop()
    # The run SIGKILLs an engine that ignores SIGTERM (the log says so), within the unload
    # timeout.
    assert st.exit_code == 0 and not st.killed, st
    assert "XT stopped with SIGKILL; the run exits 0" in world.log("XT"), world.log("XT")
    assert st.elapsed_s < UNLOAD_TIMEOUT_S, st
    assert not psutil.pid_exists(pid3) and not psutil.pid_exists(pidt)
    wait_for(lambda: d.status()["leases"] == [], 30, "both leases ended")


def test_stop_with_a_stream_in_flight_lets_it_finish_within_the_grace_and_exits_in_time(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A", size="2GiB", weights="1GiB", park=False,
                                 engine_args=("--tokens-per-s", "10", "--protocol")))
    a.start()
    answers: list[str] = []
    t = threading.Thread(target=lambda: answers.append(_try_chat(a.port, "A", 200)))
    t.start()
    wait_for(lambda: (d.lease_of("A") or {}).get("pid") and _in_flight(a.port), 30,
             "the stream in flight")
    st = a.stop()
    t.join(30)
    assert st.exit_code == 0 and not st.killed and st.elapsed_s < UNLOAD_TIMEOUT_S, st
    # The stream did not finish within the 1 s grace: the engine stopped and the client saw
    # the stream end early, never a hang.
    assert answers and answers[0] != "complete", answers
    assert st.elapsed_s >= 1.0, st      # the in-flight grace (--stop-grace 1s) was given


def test_kill9_of_berth_run_leaves_no_engine_and_no_card_memory(world):
    d = world.start_berthd()
    a = world.model("A", run_cmd("A"))
    a.start()
    pid = world.engine_pid("A")
    wait_for(lambda: world.sim().cards[0].used_bytes >= 13 * GiB, 30, "the weights loaded")
    lease_id = d.lease_of("A")["id"]
    os.kill(a.pid, signal.SIGKILL)                      # the run alone, not its group
    a.proc.wait(10)
    wait_for(lambda: not _alive(pid), 30, "the engine gone (parent-death signal / watchdog)")
    wait_for(lambda: world.sim().cards[0].used_bytes == 0, 30,
             "the simulated card freed the engine's memory")
    wait_for(lambda: d.lease_of("A") is None, 30, "berthd dropped the lease")
    kinds = [e["kind"] for e in d.timeline() if e["lease"] == lease_id]
    assert "exit" in kinds and "freed" in kinds, kinds
    assert world.sim().cards[0].oom_events == 0
    # Nothing of the run is left: engine, watchdog (only berthd remains of this test's processes).
    wait_for(lambda: [p.pid for p in ours(world.tmp)] == [d.proc.pid], 30,
             "only berthd left")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _engine(mode: str, code: str) -> list[str]:
    """A minimal engine (tests/run/tiny_engine.py) that answers /health and streams, and on
    SIGTERM exits ``code`` (``exit``) or ignores it (``ignore``)."""
    here = os.path.dirname(__file__)
    return [sys.executable, os.path.join(here, "tiny_engine.py"), "--port", "{port}",
            "--on-term", mode, "--code", code]


def _in_flight(port: int) -> bool:
    """The stub engine (``--protocol``) has a request in flight, asked through the front."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/berth/v1/state")
        r = conn.getresponse()
        return r.status == 200 and json.loads(r.read())["in_flight"] > 0
    except OSError:
        return False
    finally:
        conn.close()


def _try_chat(port: int, model: str, max_tokens: int) -> str:
    try:
        ans = chat(port, model, max_tokens=max_tokens)
    except Exception as e:          # noqa: BLE001 - the stream was cut: that is the point
        return f"cut: {type(e).__name__}"
    return "complete" if ans.content_chunks == max_tokens else f"short: {ans.content_chunks}"
