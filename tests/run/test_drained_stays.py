"""Issue 35, part 1: a run outlives its engine's stops, by default.

One simulated 24 GiB card (1 GiB reserve); B (12 GiB) serves behind a plain ``berth run``
(no ``--keep-front``, no park), then W (20 GiB) asks and B is drained. Before issue 35 B's run
exited and its next request got "connection refused" for good. Now B's run keeps its front:
``berth status`` lists it as drained; B's next request, sent while W serves a long stream, waits
(held, the queue saying why), B's run asks for a new grant, and once W's turn ends (its stream
done, W drained in turn) B's engine starts again on the card and the request is answered 200;
W's run stays too, listed as drained. ``--exit-on-drain`` keeps the old exit for a manager that
must see it.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import subprocess

from tests.berthd import BERTH, Berthd, berth_run, sim_config
from tests.helpers import free_port, stop_all, wait_for
from tests.run.world import chat


def _drained(d: Berthd, engine: str) -> dict | None:
    return next((r for r in d.status()["drained"] if r["engine"] == engine), None)


def _waiting(d: Berthd, engine: str) -> dict | None:
    return next((w for w in d.status()["waiting"] if w["engine"] == engine), None)


@contextlib.contextmanager
def _b_then_w(tmp_path, b_size: str, w_size: str):
    """berthd on one 24 GiB card; B (``b_size``) granted and answering; then W (``w_size``)
    asks, its engine holding each stream after its first token while ``hold`` exists (the
    test removes it). Yields ``(d, pb, pw, b, w, hold, pool)``; stops everything after."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    pb, pw = free_port(), free_port()
    weights = f"{int(b_size.removesuffix('GiB')) - 1}GiB"
    procs = [berth_run(d, "B", "--front", f"127.0.0.1:{pb}", "--size", b_size,
                       weights=weights), d.proc]
    pool = futures.ThreadPoolExecutor(2)
    try:
        wait_for(lambda: d.state_of("B") == "active", 60, "B granted")
        assert chat(pb, "B").finish_reason is not None
        hold = tmp_path / "token-hold"
        hold.touch()
        weights = f"{int(w_size.removesuffix('GiB')) - 1}GiB"
        procs.append(berth_run(d, "W", "--front", f"127.0.0.1:{pw}", "--size", w_size,
                               weights=weights, extra_engine=("--token-hold", str(hold))))
        yield d, pb, pw, procs[0], procs[2], hold, pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all(procs, tmp_path)


def test_a_drained_run_keeps_its_front_and_serves_again_once_the_card_has_room(tmp_path):
    with _b_then_w(tmp_path, "12GiB", "20GiB") as (d, pb, pw, b, w, hold, pool):
        wait_for(lambda: d.state_of("W") == "active", 60, "W granted")
        entry = wait_for(lambda: _drained(d, "B"), 30, "B listed as drained")
        assert b.poll() is None, "B's run exited on the drain"
        assert entry["waiters"] == 0 and entry["front"] == f"127.0.0.1:{pb}", entry
        assert d.lease_of("B") is None          # no lease: it holds nothing on the card

        wait_for(lambda: chat(pw, "W", max_tokens=1), 30, "W serving")
        busy = pool.submit(chat, pw, "W", max_tokens=300, timeout_s=120)
        wait_for(lambda: (d.lease_of("W") or {}).get("in_flight"), 30, "W's stream reported")
        held = pool.submit(chat, pb, "B", timeout_s=120)
        entry = wait_for(lambda: (_drained(d, "B") or {}).get("waiters") == 1
                         and _drained(d, "B"), 30, "B's request counted as its waiter")
        wait_for(lambda: _waiting(d, "B"), 30, "B asking for a new grant")
        assert _waiting(d, "B")["why"], "the queue says why B waits"
        assert not held.done()
        board = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                               timeout=30).stdout
        assert "drained" in board and "1 request(s) waiting" in board, board
        metrics = d.call("GET", "/metrics")[1]["raw"]
        assert 'berth_drained_waiters{engine="B"} 1.0' in metrics, metrics
        assert not busy.done() and not held.done()
        hold.unlink()                           # W's stream goes on to its end

        answer = held.result(timeout=120)       # W's turn ends with its stream: room again
        assert answer.finish_reason is not None and answer.text, answer
        assert busy.result(timeout=10).finish_reason is not None
        wait_for(lambda: _drained(d, "B") is None, 30, "B no longer drained")
        assert d.state_of("B") == "active" and b.poll() is None
        assert _drained(d, "W") is not None and w.poll() is None
        assert d.sim_oom() == 0


def test_exit_on_drain_ends_the_run_for_a_manager_that_must_see_it(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    pb = free_port()
    b = berth_run(d, "B", "--front", f"127.0.0.1:{pb}", "--size", "12GiB", "--exit-on-drain",
                  weights="11GiB")
    procs = [b, d.proc]
    try:
        wait_for(lambda: d.state_of("B") == "active", 60, "B granted")
        assert chat(pb, "B").finish_reason is not None
        w = berth_run(d, "W", "--front", f"127.0.0.1:{free_port()}", "--size", "20GiB",
                      "--priority", "10", weights="19GiB")
        procs.append(w)
        assert b.wait(60) == 0
        assert _drained(d, "B") is None
    finally:
        stop_all(procs, tmp_path)


def test_an_engine_whose_command_pins_its_card_is_never_moved_and_status_says_why(tmp_path):
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB"), ("gpu1", "24GiB")])).start()
    procs = [d.proc]
    try:
        procs.append(berth_run(d, "free", "--front", f"127.0.0.1:{free_port()}", "--size",
                               "2GiB", weights="1GiB"))
        log = tmp_path / "run-pinned.log"
        procs.append(subprocess.Popen(
            [BERTH, "run", "--engine", "pinned", "--front", f"127.0.0.1:{free_port()}",
             "--size", "2GiB", "--", "env", "CUDA_VISIBLE_DEVICES=0", BERTH, "sim", "engine",
             "--port", "{port}", "--weights", "1GiB", "--load-s", "0.1"],
            env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
            start_new_session=True))
        wait_for(lambda: d.state_of("free") == "active" and d.state_of("pinned") == "active",
                 60, "both granted")
        assert d.lease_of("free")["move"] == {"movable": True, "why": None, "restore_across": False}
        move = d.lease_of("pinned")["move"]
        assert not move["movable"] and "CUDA_VISIBLE_DEVICES=0" in move["why"], move
        # The board lists a lease once its card shows it (the fresh-clone suite read it once,
        # right after the grant, and found only "free"): wait for the line.
        said = "never moved: its command sets CUDA_VISIBLE_DEVICES=0"
        board = wait_for(lambda: (b := subprocess.run(
            [BERTH, "status"], env=d.env, capture_output=True, text=True, timeout=30).stdout)
            and "pinned" in b and said in b and b, 60, "berth status naming the pinned run")
        assert "pinned" in board and said in board, board
    finally:
        stop_all(procs, tmp_path)


def test_whether_a_run_may_move_survives_a_berthd_restart(tmp_path):
    """The free run stays movable and the pinned one pinned (with its reason) once berthd has
    restarted and taken both leases back from its state."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB"), ("gpu1", "24GiB")])).start()
    procs = [d.proc]
    try:
        procs.append(berth_run(d, "free", "--front", f"127.0.0.1:{free_port()}", "--size",
                               "2GiB", weights="1GiB"))
        log = tmp_path / "run-pinned.log"
        procs.append(subprocess.Popen(
            [BERTH, "run", "--engine", "pinned", "--front", f"127.0.0.1:{free_port()}",
             "--size", "2GiB", "--", "env", "CUDA_VISIBLE_DEVICES=0", BERTH, "sim", "engine",
             "--port", "{port}", "--weights", "1GiB", "--load-s", "0.1"],
            env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
            start_new_session=True))
        wait_for(lambda: d.state_of("free") == "active" and d.state_of("pinned") == "active",
                 60, "both granted")
        before = {n: d.lease_of(n)["id"] for n in ("free", "pinned")}
        d.stop()
        d.start()
        procs[0] = d.proc
        wait_for(lambda: all(d.lease_of(n) and d.lease_of(n)["id"] == i
                             for n, i in before.items()), 60, "both leases taken back")
        assert d.lease_of("free")["move"] == {"movable": True, "why": None, "restore_across": False}
        move = d.lease_of("pinned")["move"]
        assert not move["movable"] and "CUDA_VISIBLE_DEVICES=0" in move["why"], move
    finally:
        stop_all(procs, tmp_path)


def test_a_drained_runs_request_from_the_holders_last_client_ends_the_holders_turn(tmp_path):
    """One person alternating two drain-only engines (no park: the RAM budget has no room for
    a second checkpoint, as a new user found on the llama-swap page's set-up). The drained run
    asks for a new lease for the request its front holds, and says whose it is, as a wake
    does: the holder's last answer went to that very client, so it yields at once (issue 34).
    Before, the new lease named no client and the holder kept its card inside its minimum
    turn, as long as a switch back would cost: 'B is inside its minimum turn and expects a
    request within a switch back'."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")],
                                    policy={"min_turn": "120s"})).start()
    pa, pb = free_port(), free_port()
    a = berth_run(d, "A", "--front", f"127.0.0.1:{pa}", "--size", "14GiB", weights="13GiB")
    procs = [a, d.proc]
    try:
        wait_for(lambda: d.state_of("A") == "active", 60, "A granted")
        assert chat(pa, "A").finish_reason is not None
        b = berth_run(d, "B", "--front", f"127.0.0.1:{pb}", "--size", "14GiB", weights="13GiB")
        procs.append(b)
        # A is idle and B's start names no client: A yields (drained; its run stays).
        wait_for(lambda: _drained(d, "A"), 60, "A drained for B")
        wait_for(lambda: (d.lease_of("B") or {}).get("ready"), 60, "B serving")
        for _ in range(3):      # B's client asks back to back: B expects more of it
            assert chat(pb, "B").finish_reason is not None  # B's last answer: to this client
        # The same client now asks A: inside B's 120 s turn, only the forecast ends it.
        answer = chat(pa, "A", timeout_s=100)
        assert answer.finish_reason is not None, answer
        kept = [e.get("text", "") for e in d.timeline() if e["engine"] == "A"
                and "minimum turn" in e.get("text", "")]
        assert not kept, kept
        assert d.sim_oom() == 0
    finally:
        stop_all(procs, tmp_path)


def test_a_drained_runs_new_grant_is_withdrawn_when_its_client_goes(tmp_path):
    """A new user's client gave up (Ctrl-C on curl) on a drained engine's request while it
    waited for the card: the run's request for a new grant stayed in the queue, and once the
    holder's stream ended berthd drained the holder, the engine in use, to start the other for
    nobody. As a wake nobody waits for is withdrawn, so is this grant: the holder keeps its
    card, and the drained run waits again for its next write."""
    import json
    import socket
    with _b_then_w(tmp_path, "14GiB", "14GiB") as (d, pb, pw, b, w, hold, pool):
        wait_for(lambda: _drained(d, "B"), 60, "B drained for W")
        wait_for(lambda: chat(pw, "W", max_tokens=1), 30, "W serving")
        busy = pool.submit(chat, pw, "W", max_tokens=200, timeout_s=120)
        wait_for(lambda: (d.lease_of("W") or {}).get("in_flight"), 30, "W's stream reported")
        body = json.dumps({"model": "B", "messages": [{"role": "user", "content": "hi"}]})
        s = socket.create_connection(("127.0.0.1", pb), timeout=10)
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: _waiting(d, "B"), 30, "B asking for a new grant")
        s.close()                                   # the client gives up
        wait_for(lambda: _waiting(d, "B") is None, 30, "B's request for a grant withdrawn")
        assert not busy.done(), "B's grant ended only with W's stream, not with its client"
        hold.unlink()                               # W's stream goes on to its end
        assert busy.result(timeout=120).finish_reason is not None
        assert d.state_of("W") == "active" and _drained(d, "W") is None
        assert _drained(d, "B") is not None and b.poll() is None
        # B's next write still starts it again (its front asks anew).
        assert chat(pb, "B", timeout_s=100).finish_reason is not None
        assert d.sim_oom() == 0
