"""Issue 35: ``berth run`` programs under a real supervisord outlive their engine's drains.

The README's example (hosts/supervisor/README.md, "Parks and lends: wrap the command in
``berth run --front``": ``autorestart=unexpected``), five programs of 9 GiB starting together
on one simulated 24 GiB card. Two fit; the others wait for room, and each minimum turn (short
here, so the drains come within the test) lets a waiter drain an idle holder. Before issue 35 a
drained run exited 0, which ``autorestart=unexpected`` takes as a wanted exit: after 30 s two ran
and three had exited for good. Now no program exits: a drained run keeps its front, and
``berth status`` lists every one that is not serving, as waiting or drained, with its reason.
A request to a drained one is then answered 200 (its engine started again: a cold wake).
"""

from __future__ import annotations

import json
import socket

from tests.helpers import wait_for

from .conftest import PY, Prog, free_port

NAMES = [f"llama-{i}" for i in range(5)]


def _program(name: str, port: int) -> Prog:
    cmd = (f"{PY} -m berth.cli run --engine {name} --front 127.0.0.1:{port} --size 9GiB -- "
           f"{PY} -m berth.cli sim engine --port {{port}} --weights 8GiB --card gpu0 "
           f"--load-s 0.2")
    # Started together once berthd answers: runs that start before it fail open, and that
    # race (two unleased engines loading at once) is not what this test is about.
    return Prog(name, cmd, autorestart="unexpected", startsecs=1, autostart=False)


def _post(port: int, model: str) -> bytes:
    body = json.dumps({"model": model, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                  .encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def _settled(s) -> dict | None:
    """Two engines serving and the other three listed, each with its reason; else None."""
    st = s.status()
    active = [le["engine"] for le in st["leases"]
              if [sh["state"] for sh in le["shares"]] == ["active"]]
    listed = {w["engine"]: w["why"] for w in st["waiting"]}
    listed.update({r["engine"]: r["why"] for r in st["drained"]})
    if len(active) == 2 and len(listed) == 3 and set(active) | set(listed) == set(NAMES):
        return {"st": st, "active": active, "listed": listed}
    return None


def test_five_berth_run_programs_on_one_card_none_exits_for_lack_of_room(stack_factory):
    ports = {n: free_port() for n in NAMES}
    s = stack_factory([_program(n, ports[n]) for n in NAMES],
                      policy={"min_turn": "2s", "max_turn": "2s"})
    s.ctl("start", *NAMES)
    wait_for(lambda: all(s.info(n).statename == "RUNNING" for n in NAMES), 60,
             "every program RUNNING")
    # Drains happen: a waiter takes an idle holder's card once its turn is over.
    wait_for(lambda: sum(e["kind"] == "drain" for e in s.berth_timeline_all()) >= 2, 120,
             "two drains for waiters")
    got = wait_for(lambda: _settled(s), 120, "two serving, three listed with their reasons")
    assert all(why for why in got["listed"].values()), got["listed"]
    for n in NAMES:
        info = s.info(n)
        assert info.statename == "RUNNING", (n, info, s.log(f"{n}.log")[-2000:])
    drained = [r["engine"] for r in got["st"]["drained"]]
    assert drained, got["st"]
    answer = _post(ports[drained[0]], drained[0])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:400]
    assert all(s.info(n).statename == "RUNNING" for n in NAMES)
    assert s.oom_events() == 0
