"""Issue 26, "Engine names are owned", tried by a second Unix user the test creates (root runs
berthd, the gateway and the victim's engines; the machine runs the tests as root):

- the hijack: Mallory leases a name declared in berth.toml for another user, an undeclared name
  another user's lease holds (as its engine name or as an alias), or points the gateway at a
  host that is neither this machine nor a peer: each a 403;
- routing a hijacked name is impossible: a lease for it that reached berthd's ledger anyway
  (restored from the state file, as an older berthd would have let it in) gets no request from
  the gateway;
- the wake by anyone: Mallory's wake, wake withdrawal, touch, ready, extend and jobs on another
  user's lease are each a 403 and change nothing; the owner (root) may.
"""

from __future__ import annotations

import os
import subprocess

from tests.berthd import BERTH, berth_run, stop_proc, wait_for
from tests.gateway.world import chat, free_port, http
from tests.security.users import Hijacker, attack


def _gateway(d, runs) -> int:
    port = free_port()
    log = open(d.tmp / "gateway.log", "ab")
    gw = subprocess.Popen([BERTH, "gateway", "--listen", f"127.0.0.1:{port}", "--config",
                           str(d.config)], env=d.env, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
    runs.append(gw)

    def up():
        assert gw.poll() is None, (d.tmp / "gateway.log").read_text()
        try:
            return http(port, "GET", "/v1/models", timeout=2)[0] == 200
        except OSError:
            return False
    wait_for(up, 30, "the gateway to answer")
    return port


def _serving(d, runs, engine: str, *args: str, protocol: bool = False) -> tuple[str, int]:
    front = free_port()
    runs.append(berth_run(d, engine, "--front", f"127.0.0.1:{front}", "--size", "4GiB", *args,
                          extra_engine=("--model", engine, *(("--protocol",) if protocol
                                                             else ()))))
    wait_for(lambda: d.state_of(engine) == "active", 30, f"{engine} active")
    wait_for(lambda: d.lease_of(engine).get("ready"), 30, f"{engine} ready")
    return d.lease_of(engine)["id"], front


def test_a_declared_name_is_leased_only_by_whom_its_entry_names(make_user, shared_berthd):
    bob, mallory = make_user(), make_user()
    d = shared_berthd(extra=f'[engines.qwen]\nsize = "4GiB"\n'
                            f'[engines.bobs]\nsize = "1GiB"\nusers = ["{bob.pw_name}"]\n')
    lease = {"engine": "qwen", "shares": [{"size": "1GiB"}]}
    status, body = attack(mallory, d, "POST", "/v1/leases", lease)
    assert status == 403, body
    assert "declared in berth.toml" in body["error"]["message"], body
    # An alias is a name too: Mallory's own engine may not answer for "qwen".
    status, body = attack(mallory, d, "POST", "/v1/leases",
                          {"engine": "mallorys", "shares": [{"size": "1GiB"}],
                           "aliases": ["qwen"]})
    assert status == 403 and "'qwen'" in body["error"]["message"], body
    # The users an entry names may; nobody else (the operators are not named there).
    status, body = attack(bob, d, "POST", "/v1/leases", {**lease, "engine": "bobs"})
    assert status == 201, body
    status, body = attack(mallory, d, "POST", "/v1/leases", {**lease, "engine": "bobs"})
    assert status == 403 and bob.pw_name in body["error"]["message"], body
    # (Bob's lease ended with the process that asked for it.)
    assert not [le for le in d.status()["leases"] if le["engine"] in ("qwen", "mallorys")]


def test_an_undeclared_name_is_the_first_leases_until_it_ends(make_user, shared_berthd, runs,
                                                             public_dir):
    d = shared_berthd()
    lid, _ = _serving(d, runs, "victim")
    mallory = make_user()
    h = Hijacker(mallory, d, "victim", free_port())
    h.stop()
    assert h.status == 403 and "held by a lease of uid 0" in h.answer["error"]["message"], \
        h.answer
    status, body = attack(mallory, d, "POST", "/v1/leases",
                          {"engine": "mine", "shares": [{"size": "1GiB"}],
                           "aliases": ["victim"]})
    assert status == 403, body
    assert [le["id"] for le in d.status()["leases"]] == [lid]
    # Once the victim's lease ends, the name is free for the next who takes it.
    stop_proc(runs.pop())
    wait_for(lambda: d.lease_of("victim") is None, 30, "the victim's lease to end")
    h = Hijacker(mallory, d, "victim", free_port())
    try:
        assert h.status == 201, h.answer
    finally:
        h.stop()


def test_a_front_that_is_neither_here_nor_a_peer_is_refused(make_user, shared_berthd):
    d = shared_berthd()
    mallory = make_user()
    h = Hijacker(mallory, d, "mine", free_port(), host="198.51.100.7")
    h.stop()
    assert h.status == 403 and "'198.51.100.7'" in h.answer["error"]["message"], h.answer
    status, body = attack(mallory, d, "POST", "/v1/leases",
                          {"engine": "mine", "shares": [{"size": "1GiB"}],
                           "front": "http://example.com:80"})
    assert status == 403 and "'example.com'" in body["error"]["message"], body
    assert d.status()["leases"] == []
    # Her own name, with a front here, is hers.
    h = Hijacker(mallory, d, "mine", free_port())
    h.stop()
    assert h.status == 201, h.answer


def test_routing_a_hijacked_name_is_impossible(make_user, shared_berthd, runs):
    """Nothing of Mallory's is routed to: her lease for the declared "qwen" is refused, and
    the same lease restored from the state file (let in by an older berthd) is in berthd's
    ledger but marked unchecked, so the gateway sends it no request."""
    from berth.daemon import store
    from berth.decide.model import Capabilities, Lease, Share, ShareState
    d = shared_berthd(extra='[engines.qwen]\nsize = "4GiB"\n')
    _serving(d, runs, "other")
    gw = _gateway(d, runs)
    mallory = make_user()
    port = free_port()
    h = Hijacker(mallory, d, "qwen", port)
    try:
        assert h.status == 403, h.answer
        code, doc, _ = chat(gw, "qwen")
        assert code == 503 and not doc.get("hijacked"), doc        # qwen is not running
        # Her process holds the lease in the state file berthd restarts from.
        d.stop()
        snap = store.load(d.tmp / "state" / "state.toml")
        pci = "0000:01:00.0"
        snap.leases.append(Lease(
            id="qwen-1-1", engine="qwen", shares={pci: Share(pci, 1 << 30,
                                                             state=ShareState.ACTIVE)},
            caps=Capabilities(front=f"127.0.0.1:{port}"), owner_pid=h.proc.pid,
            owner_start_time=__import__("psutil").Process(h.proc.pid).create_time()))
        store.write_atomic(d.tmp / "state" / "state.toml", store.dump(snap))
        d.start()
        le = d.lease_of("qwen")
        assert le is not None and le["owner_checked"] is False, le
        assert d.lease_of("other")["owner_checked"] is True
        # A lease made after the restart: once the gateway lists it, it has read berthd since.
        assert d.call("POST", "/v1/leases", {"engine": "probe", "owner_pid": os.getpid(),
                                             "shares": [{"size": "1GiB"}]})[0] == 201

        def states():
            return {m["id"]: m["berth"]["state"] for m in http(gw, "GET", "/v1/models")[1]["data"]}
        wait_for(lambda: "probe" in states(), 30, "the gateway to read berthd again")
        assert states()["qwen"] in ("not running", "unreachable"), states()
        code, doc, _ = chat(gw, "qwen")
        assert code == 503 and not doc.get("hijacked"), doc
        assert chat(gw, "other")[0] == 200             # the gateway routes what it may
    finally:
        assert h.hits() == []


def test_a_non_owner_may_not_wake_or_touch_a_lease(make_user, shared_berthd, runs):
    d = shared_berthd(cards=(("gpu0", "24GiB"),))
    lid, _ = _serving(d, runs, "victim", "--park", "hook", "--adapter", "protocol",
                      protocol=True)
    assert d.call("POST", "/v1/operator/park", {"target": "victim"})[0] == 200
    wait_for(lambda: d.state_of("victim") == "parked", 30, "the victim parked")
    mallory = make_user()
    for method, verb, body in (("POST", "wake", None), ("DELETE", "wake", None),
                               ("POST", "touch", None), ("POST", "ready", None),
                               ("POST", "extend", {"bytes": "1GiB"}),
                               ("POST", "jobs", {"in_flight": 3})):
        status, answer = attack(mallory, d, method, f"/v1/leases/{lid}/{verb}", body)
        assert status == 403, (verb, answer)
        assert "does not own" in answer["error"]["message"], (verb, answer)
    assert d.state_of("victim") == "parked"
    assert not [e for e in d.timeline() if e.get("kind") in ("wake", "resume")], d.timeline()
    # Its owner (root, an operator too) may.
    assert d.call("POST", f"/v1/leases/{lid}/wake")[0] == 200
    wait_for(lambda: d.state_of("victim") == "active", 30, "the victim woken by its owner")
