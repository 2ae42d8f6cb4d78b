"""The pure parts: switch costs from notes, the ranking of machines, signatures."""

from __future__ import annotations

import hashlib

import pytest
from berth.daemon.costs import SwitchCosts
from berth.gateway.choose import Candidate, rank
from berth.gateway.signing import Refused, Verifier, sign
from berth.gateway.table import address_url, lease_state


def test_switch_costs_pair_notes_per_lease_and_take_the_median():
    c = SwitchCosts(keep=3)
    assert c.note("l1", "qwen", "grant", 10.0) is None
    assert c.note("l1", "qwen", "ready", 12.5) == 2.5
    for start, took in ((20.0, 0.4), (30.0, 0.6), (40.0, 0.5), (50.0, 9.0)):
        c.note("l1", "qwen", "park", start)
        c.note("l1", "qwen", "parked", start + took)
    c.note("l1", "qwen", "resume", 60.0)
    c.note("l1", "qwen", "wake", 61.0)
    # A park called off is not a sample; nor is an end without a start.
    c.note("l1", "qwen", "park", 70.0)
    c.note("l1", "qwen", "park.off", 71.0)
    c.note("l1", "qwen", "parked", 90.0)
    c.note("l2", "other", "wake", 5.0)
    got = c.of("qwen")
    assert got == {"park_s": 0.6, "restore_s": 1.0, "cold_start_s": 2.5,
                   "samples": {"park_s": 3, "restore_s": 1, "cold_start_s": 1}}  # last 3 parks
    assert c.of("nobody")["park_s"] is None
    assert set(c.as_json()) == {"qwen"}


def test_ranking_awake_then_parked_then_not_running_then_cost_queue_and_local():
    def c(m, state, local=False, queue=0, **costs):
        return Candidate(m, local, state, queue, costs)
    assert [x.machine for x in rank([c("b", "parked"), c("c", "active")])] == ["c", "b"]
    assert [x.machine for x in rank([c("b", "not running"), c("c", "parked")])] == ["c", "b"]
    assert [x.machine for x in rank([c("b", "parked", restore_s=4.0),
                                     c("c", "parked", restore_s=0.5)])] == ["c", "b"]
    assert [x.machine for x in rank([c("b", "active", queue=3),
                                     c("c", "active", queue=1)])] == ["c", "b"]
    assert [x.machine for x in rank([c("b", "active"), c("a", "active", local=True)])] == ["a", "b"]
    assert [x.machine for x in rank([c("b", "draining"), c("c", "not running")])] == ["c", "b"]


def _d(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_signatures_refuse_a_wrong_key_a_changed_call_a_stale_one_and_a_replay():
    now = [1000.0]
    v = Verifier("s" * 32, window_s=30.0, me="B", clock=lambda: now[0])
    h = sign("s" * 32, "A", "POST", "/v1/chat/completions", b"{}", to="B", now=1000.0)
    assert v.verify("POST", "/v1/chat/completions", _d(b"{}"), h) == "A"
    with pytest.raises(Refused) as e:
        v.verify("POST", "/v1/chat/completions", _d(b"{}"), h)
    assert e.value.reason == "replayed"
    for args, reason in (((b"{}", "x" * 32), "bad_signature"), ((b"[]", "s" * 32), "bad_signature")):
        body, key = args
        h = sign(key, "A", "POST", "/v1/chat/completions", b"{}", to="B", now=1000.0)
        with pytest.raises(Refused) as e:
            v.verify("POST", "/v1/chat/completions", _d(body), h)
        assert e.value.reason == reason
    h = sign("s" * 32, "A", "GET", "/x", to="B", now=960.0)
    with pytest.raises(Refused) as e:
        v.verify("GET", "/x", _d(b""), h)
    assert e.value.reason == "stale"
    h = sign("s" * 32, "A", "GET", "/x", to="B", now=1000.0)
    with pytest.raises(Refused) as e:
        v.verify("GET", "/y", _d(b""), h)            # another path
    assert e.value.reason == "bad_signature"
    with pytest.raises(Refused) as e:
        v.verify("GET", "/x", _d(b""), {})
    assert e.value.reason == "unsigned"


def test_a_signature_names_its_destination_and_a_replay_is_refused_after_a_restart(tmp_path):
    """Issue 26: a signed call could be sent to another peer with the same key, and replayed
    after the receiver restarted (its memory of nonces was gone)."""
    now = [1000.0]
    log = tmp_path / "nonces"
    b = Verifier("s" * 32, window_s=30.0, me="B", log_path=log, clock=lambda: now[0])
    call = sign("s" * 32, "A", "POST", "/v1/completions", b"{}", to="B", now=1000.0)
    assert b.verify("POST", "/v1/completions", _d(b"{}"), call) == "A"
    c = Verifier("s" * 32, window_s=30.0, me="C", clock=lambda: now[0])
    fresh = sign("s" * 32, "A", "POST", "/v1/completions", b"{}", to="B", now=1000.0)
    with pytest.raises(Refused) as e:
        c.verify("POST", "/v1/completions", _d(b"{}"), fresh)     # B's call, sent to C
    assert e.value.reason == "wrong_peer"
    # Only the engines list may be asked before the sender knows the name.
    first = sign("s" * 32, "A", "GET", "/berth/v1/peer/engines", now=1000.0)
    assert c.verify("GET", "/berth/v1/peer/engines", _d(b""), first) == "A"
    with pytest.raises(Refused) as e:
        c.verify("POST", "/v1/completions", _d(b"{}"),
                 sign("s" * 32, "A", "POST", "/v1/completions", b"{}", now=1000.0))
    assert e.value.reason == "wrong_peer"
    b.close()
    now[0] = 1005.0             # B restarts within the window: the call is still refused
    b2 = Verifier("s" * 32, window_s=30.0, me="B", log_path=log, clock=lambda: now[0])
    with pytest.raises(Refused) as e:
        b2.verify("POST", "/v1/completions", _d(b"{}"), call)
    assert e.value.reason == "replayed"
    b2.close()


def test_states_and_addresses():
    def lease(*sts):
        return {"shares": [{"state": s} for s in sts]}
    assert lease_state(lease("active")) == "active"
    assert lease_state(lease("parked")) == "parked"
    assert lease_state(lease("active", "lent")) == "lent"
    assert lease_state(lease("draining")) == "draining"
    assert lease_state(lease("waiting")) == "waiting"
    assert address_url("127.0.0.1:80") == "http://127.0.0.1:80"
    assert address_url("http://h:1/") == "http://h:1"
    assert address_url("comfyui-port") is None and address_url(None) is None
    assert address_url("a word: not 1") is None


#: berthd's verdict on a lease the gateway may route to (issue 26: names are owned).
CHECKED = {"owner_checked": True, "front_checked": True}


def test_the_comfyui_nodes_lease_routes_to_the_url_it_names(tmp_path):
    """The node registers its front as ``comfyui-node URL[; FLAG ...]``; the gateway sent
    ComfyUI's API to ``http://comfyui-node http://127.0.0.1:8188`` (a 502), even over an
    entry's ``url``."""
    from berth.client import Client
    from berth.config import parse
    from berth.gateway.table import LocalTable

    def target(entry: dict, front: str) -> str | None:
        t = LocalTable(parse({"engines": {"comfyui": entry}}), Client(socket=tmp_path / "x"))
        st = {"leases": [{"id": "comfyui-1-1", "engine": "comfyui",
                          "capabilities": {"front": front}, **CHECKED,
                          "shares": [{"state": "active"}]}], "waiting": []}
        return {r.name: r.target for r in t._build(st)}["comfyui"]

    assert target({"size": "4GiB"}, "comfyui-node http://127.0.0.1:8188") \
        == "http://127.0.0.1:8188"
    assert target({"size": "4GiB"}, "comfyui-node http://127.0.0.1:8188/; --highvram: "
                                    "unloading frees nothing, no park") == "http://127.0.0.1:8188"
    assert target({"url": "http://127.0.0.1:9"}, "comfyui-node http://127.0.0.1:8188") \
        == "http://127.0.0.1:8188"


def test_network_config_is_off_by_default_and_checks_peers_and_key():
    from berth.config import ConfigError, parse
    assert parse({}).network.peers == []
    net = parse({"network": {"peers": ["10.0.0.2:7880", "http://b:7880/"],
                             "key": "x" * 16, "peer_timeout": "500ms"}}).network
    assert net.peers == ["http://10.0.0.2:7880", "http://b:7880"] and net.peer_timeout == 0.5
    for doc, words in (({"peers": ["b:7880"]}, "network.key"),
                       ({"peers": ["no port"], "key": "x" * 16}, "HOST:PORT"),
                       ({"key": "short"}, "key"),
                       ({"peer_timeout": "0s"}, "peer_timeout")):
        with pytest.raises(ConfigError) as e:
            parse({"network": doc})
        assert words in str(e.value), str(e.value)


def test_runs_keep_their_routes_while_berthd_is_down(tmp_path):
    """berth run fails open: its front forwards while berthd is down. The gateway dropped the
    run's route then and answered 404 "served by no engine here or on a peer; known: "."""
    import asyncio

    from berth.client import Client
    from berth.config import parse
    from berth.gateway.table import LocalTable

    t = LocalTable(parse({"engines": {"cfg": {"url": "http://127.0.0.1:9"}}}),
                   Client(socket=tmp_path / "no-berthd.sock"))
    t.routes = t._build({"leases": [{"id": "llama-1-1", "engine": "llama",
                                     "capabilities": {"front": "127.0.0.1:17102"}, **CHECKED,
                                     "shares": [{"state": "active"}]}], "waiting": []})
    asyncio.run(t.refresh())
    assert t.berthd_up is False
    assert t.find("llama") is not None and t.find("llama").target == "http://127.0.0.1:17102"
    assert t.find("cfg").target == "http://127.0.0.1:9"


def test_ranking_by_expected_time_to_first_byte():
    """Issue 27: ready idle < ready busy (by queue) < parked (restore) < loading (remaining
    load) < cold (cold start), the peer's round trip added; loading was ranked as ready."""
    def c(m, state, local=False, queue=0, rtt=0.0, loading=0.0, **costs):
        return Candidate(m, local, state, queue, costs, rtt_s=rtt, loading_s=loading)
    order = rank([c("cold", "not running", cold_start_s=5.0),
                  c("loading", "loading", cold_start_s=20.0, loading=16.0),
                  c("parked", "parked", restore_s=2.0),
                  c("busy", "active", queue=3, rtt=0.001),
                  c("busier", "active", queue=5, local=True),
                  c("idle", "active", rtt=0.05)])
    assert [x.machine for x in order] == ["idle", "busy", "busier", "parked", "loading", "cold"]
    assert [x.category for x in order] == ["ready_idle", "ready_busy", "ready_busy", "parked",
                                           "loading", "cold"]
    assert order[4].expected_s == 4.0 and order[0].expected_s == 0.05
    # Within a category, the round trip counts: a near parked machine before a far one.
    near, far = c("near", "parked", rtt=0.01, restore_s=1.0), c("far", "parked", rtt=0.5,
                                                                restore_s=1.0)
    assert [x.machine for x in rank([far, near])] == ["near", "far"]
    # Loading here, ready on a peer: the peer.
    here = c("here", "loading", local=True, loading=1.0)
    assert rank([here, c("peer", "active", rtt=0.2)])[0].machine == "peer"
    assert set(here.as_dict()) == {"category", "expected_s", "queue", "rtt_s", "loading_s"}
