"""A request for room lives no longer than its prompt's wait (issue 28). Seen against a real
ComfyUI 0.3.64, twice in two runs: a prompt got a 503 because berthd could not make room in
time, its request for more room stayed queued, and berthd later parked an idle 9 GiB LLM to
host RAM for a ComfyUI holding 0.29 GiB."""

from __future__ import annotations

import json
import subprocess
import threading

from tests.berthd import BERTH, berth_run, wait_for

from .conftest import Page, free_port, http, prompt

FLUX = ("UNETLoader", "unet_name", "flux-dev.safetensors")
#: A busy LLM keeps its card for its 30 s minimum turn; a held prompt waits 3 s at most.
POLICY = {"min_turn": "30s", "ram_budget": "64GiB", "wait_limit": "3s"}


def _busy_llm_beside_comfyui(world, wait_limit: str = "3s"):
    """berthd, a 14 GiB LLM answering one chat, and ComfyUI leased beside it with nothing
    loaded. Returns ``(berthd, comfyui, chat thread)``. The chat is held after its first token
    while the file ``d.tmp / "token-hold"`` exists (the stub's ``--token-hold``; created here,
    removed by the test) and then ends at once."""
    d = world.berthd(policy={**POLICY, "wait_limit": wait_limit})
    front = free_port()
    hold = d.tmp / "token-hold"
    hold.touch()
    world.procs.append(berth_run(
        d, "llm", "--front", f"127.0.0.1:{front}", "--size", "14GiB", "--park", "checkpoint",
        "--checkpoint-path", str(BERTH) + "-sim-cuda-checkpoint", weights="13GiB",
        extra_engine=("--kv-per-token", "1MiB", "--token-hold", str(hold))))
    wait_for(lambda: d.lease_of("llm") and d.lease_of("llm")["ready"], 20, "the LLM serving")
    c = world.comfyui("--disable-dynamic-vram")
    wait_for(lambda: d.state_of("comfyui") == "active" and c.berth()["gate"]["state"] == "open",
             10, "ComfyUI leased")
    chat = threading.Thread(target=http, daemon=True, args=(
        "POST", f"http://127.0.0.1:{front}/v1/chat/completions",
        {"model": "llm", "max_tokens": 80, "messages": [{"role": "user", "content": "hi"}]}))
    chat.start()
    wait_for(lambda: d.lease_of("llm")["in_flight"] >= 1, 10, "berthd told of the chat")
    return d, c, chat


def _waiters(d) -> list[dict]:
    """``berth status --json``'s waiting queue, as a user reads it."""
    out = subprocess.run([BERTH, "status", "--json"], env=d.env, capture_output=True,
                         text=True, timeout=30, check=True)
    return json.loads(out.stdout)["waiting"]


def test_a_prompt_refused_with_a_503_leaves_no_request_and_parks_nothing_later(world):
    d, c, chat = _busy_llm_beside_comfyui(world)
    code, ans = c.post("/prompt", prompt(FLUX))
    # The busy LLM keeps its minimum turn: no room within the 3 s wait limit.
    assert code == 503, ans
    assert "did not grant" in ans["error"]["details"], ans
    wait_for(lambda: d.status()["waiting"] == [], 5, "no waiter left in berthd")
    assert _waiters(d) == []
    assert any(e["kind"] == "extend.off" for e in d.timeline())
    # The stale-grant shape: the chat ends, the LLM goes idle. A new lease's admission pass
    # runs after that; a request left queued would have parked the LLM in that very pass.
    assert chat.is_alive() and d.lease_of("llm")["in_flight"] >= 1     # busy all along
    (d.tmp / "token-hold").unlink()
    chat.join(30)
    wait_for(lambda: d.lease_of("llm")["in_flight"] == 0, 10, "the LLM idle")
    world.procs.append(berth_run(d, "probe", "--size", "1GiB", weights="512MiB"))
    wait_for(lambda: d.state_of("probe") == "active", 20, "a later lease granted")
    assert d.state_of("llm") == "active", d.timeline()
    assert not [e for e in d.timeline() if e["kind"] in ("park", "plan")
                and e.get("engine") in ("llm", "comfyui")], d.timeline()
    assert d.lease_of("comfyui")["shares"][0]["reserved_bytes"] < 2 << 30
    assert d.sim_oom() == 0


def test_a_prompt_whose_client_goes_away_withdraws_its_request(world):
    """The page that posted the prompt is closed while berthd makes room: the gate calls the
    growth check off and the node withdraws its request at once, not at the wait limit."""
    import socket
    d, c, chat = _busy_llm_beside_comfyui(world, wait_limit="20s")
    body = json.dumps(prompt(FLUX)).encode()
    port = int(c.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: [w["kind"] for w in d.status()["waiting"]] == ["extend"], 10,
                 "ComfyUI's request for room queued")
    # Well inside the 20 s wait limit: the gate looks at its client every 0.5 s.
    wait_for(lambda: d.status()["waiting"] == [], 10, "the request withdrawn when the client left")
    assert c.berth()["gate"]["client_gone"] == 1
    assert any(e["kind"] == "extend.off" for e in d.timeline())       # withdrawn, not granted
    assert d.state_of("llm") == "active"
    assert chat.is_alive()                  # the LLM was busy all along
    (d.tmp / "token-hold").unlink()
    chat.join(30)


def test_a_held_prompt_tells_its_page_berthds_reason(world):
    """While berthd makes room, the page that posted the prompt gets ComfyUI's own progress
    text on the node that loads the model, naming berthd's reason for the wait."""
    d, c, chat = _busy_llm_beside_comfyui(world)
    page = Page(c.url, "page-1")
    try:
        code, ans = c.post("/prompt", {**prompt(FLUX), "client_id": "page-1"})
        assert code == 503, ans
        # berthd's words, as its board gives them (the instruction poll's wait).
        wait_for(lambda: any("llm is inside its minimum turn" in t for _, t in page.texts), 5,
                 "the page told berthd's reason")
        assert {node for node, _ in page.texts} == {"1"}                # the loader node
        assert all(t.startswith("Berth: waiting for the card: berthd makes room for 10.0GiB "
                                "more for this prompt's models") for _, t in page.texts), \
            page.texts
        assert page.messages and page.messages[0]["type"] == "status"
    finally:
        page.close()
    assert chat.is_alive()                  # the LLM was busy all along
    (d.tmp / "token-hold").unlink()
    chat.join(30)
