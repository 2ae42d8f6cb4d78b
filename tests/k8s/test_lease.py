"""``berth k8s lease``: allocated ResourceClaims become leases at a real berthd on simulated
cards (issue 39).

No cluster runs here: the claims and the slice are fed as the API serves them
(``nvidia-memory-shares.yaml``, a ``kubectl get resourceclaims,resourceslices -o yaml`` List
written from the resource.k8s.io/v1 types and NVIDIA's DRA driver in memory-share mode)."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.berthd import BERTH, GiB
from tests.helpers import wait_for

HERE = Path(__file__).resolve().parent
SHARES = HERE / "nvidia-memory-shares.yaml"
GPU1 = "0000:02:00.0"
TWO_CARDS = (("gpu0", "24GiB"), ("gpu1", "24GiB"))


def _k8s(d, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "k8s", *args], env=d.env, capture_output=True, text=True,
                          timeout=timeout)


def _leases(d) -> dict[str, list[dict]]:
    return {le["engine"]: le["shares"] for le in d.status()["leases"]}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_two_memory_shares_become_two_leases_on_the_card_the_allocation_names(berthd, tmp_path,
                                                                               sig):
    """Each memory share of the pod's allocation is a lease on the card it names. SIGTERM, or
    SIGHUP (a terminal that closes: before, it died of it at once, exit -1, its leases not
    released), releases both leases before it exits 0."""
    d = berthd(cards=TWO_CARDS)
    log = tmp_path / "k8s.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([BERTH, "k8s", "lease", str(SHARES), "--node", "node-a"],
                                env=d.env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "holding 2 leases" in log.read_text() or proc.poll() is not None,
                 60, "berth k8s lease to hold its leases")
        assert proc.poll() is None, log.read_text()
        leases = _leases(d)
        assert set(leases) == {"k8s:llm/chat-0-gpu-x7k2p", "k8s:llm/embed-0-gpu-q9m4d"}, leases
        sizes = {}
        for engine, shares in leases.items():
            assert [s["card"] for s in shares] == [GPU1], (engine, shares)
            sizes[engine] = shares[0]["size_bytes"]
        assert sizes == {"k8s:llm/chat-0-gpu-x7k2p": 10 * GiB,
                         "k8s:llm/embed-0-gpu-q9m4d": 6 * GiB}
        assert all(s[0]["state"] == "active" for s in leases.values()), leases
        proc.send_signal(sig)
        assert proc.wait(30) == 0, log.read_text()
        assert not _leases(d), _leases(d)     # released before it exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in log.read_text()


def _write(tmp_path: Path, docs: dict) -> Path:
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump(docs))
    return p


def _fixture() -> dict:
    return yaml.safe_load(SHARES.read_text())


def _not_allocated(doc):
    del doc["items"][0]["status"]


def _other_card(doc):
    doc["items"][2]["spec"]["devices"][1]["attributes"]["uuid"]["string"] = \
        "GPU-00000000-1111-2222-3333-444444444444"


def _no_capacity(doc):
    del doc["items"][1]["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]


def _zero_capacity(doc):
    doc["items"][1]["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = \
        {"memory": "0"}


def _no_slice(doc):
    del doc["items"][2]


def _bad_quantity(doc):
    doc["items"][0]["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = \
        {"memory": "ten gigs"}


def _old_version(doc):
    doc["items"][0]["apiVersion"] = "resource.k8s.io/v1beta1"


def _wrong_type(doc):
    doc["items"][0]["status"]["allocation"]["devices"]["results"][0]["device"] = ["gpu-1"]


BAD = [
    (_not_allocated, ["llm/chat-0-gpu-x7k2p", "status.allocation", "not allocated"]),
    (_other_card, ["gpu.nvidia.com/node-a/gpu-1", "GPU-00000000-1111-2222-3333-444444444444",
                   "not on this node"]),
    (_no_capacity, ["results[0].consumedCapacity.memory", "missing"]),
    (_zero_capacity, ["consumedCapacity.memory", "'0'", "capacity.requests.memory"]),
    (_no_slice, ["gpu.nvidia.com/node-a/gpu-1", "in no ResourceSlice"]),
    (_bad_quantity, ["consumedCapacity.memory", "'ten gigs'"]),
    (_old_version, ["apiVersion", "resource.k8s.io/v1beta1"]),
    (_wrong_type, ["device", "['gpu-1']"]),
]


# The tests that make no lease share one berthd (issue 38), on one worker: spread over the
# workers, each started its own.
SHARED = pytest.mark.xdist_group("k8s_lease")


@pytest.fixture
def one_berthd(shared_berthd):
    return shared_berthd(cards=TWO_CARDS)


@SHARED
@pytest.mark.parametrize("spoil,words", BAD, ids=[f.__name__.strip("_") for f, _ in BAD])
def test_bad_claims_are_refused_in_one_line_naming_the_field(one_berthd, tmp_path, spoil, words):
    doc = copy.deepcopy(_fixture())
    spoil(doc)
    r = _k8s(one_berthd, "lease", str(_write(tmp_path, doc)))
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not one_berthd.status()["leases"]


@SHARED
def test_claims_of_another_node_are_left_alone(one_berthd, tmp_path):
    r = _k8s(one_berthd, "lease", str(SHARES), "--node", "node-b")
    assert r.returncode == 2, r.stderr
    assert "no claim given is allocated on this node ('node-b')" in r.stderr, r.stderr
    assert "llm/chat-0-gpu-x7k2p is on 'node-a'" in r.stderr, r.stderr
    # One claim moved to node-b (its slice too): node-b's agent plans it, node-a's leaves it.
    doc = _fixture()
    claim = doc["items"][1]
    claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"] = ["node-b"]
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    other = copy.deepcopy(doc["items"][2])
    other["spec"]["nodeName"] = other["spec"]["pool"]["name"] = "node-b"
    doc["items"].append(other)
    f = _write(tmp_path, doc)
    r = _k8s(one_berthd, "lease", "--plan", str(f), "--node", "node-a")
    assert r.returncode == 0, r.stderr
    assert "llm/chat-0-gpu-x7k2p: gpu1" in r.stdout and "embed-0" not in r.stdout.split(
        "left alone")[0], r.stdout
    assert "left alone:" in r.stdout and "embed-0-gpu-q9m4d is allocated on node-b" in r.stdout
    # The same claim read by node-b's agent: its slice is node-b's, the card's uuid berthd's.
    r = _k8s(one_berthd, "lease", "--plan", str(f), "--node", "node-b")
    assert r.returncode == 0, r.stderr
    assert "llm/embed-0-gpu-q9m4d: gpu1" in r.stdout, r.stdout


@SHARED
def test_a_device_whose_slice_is_another_nodes_is_refused(one_berthd, tmp_path):
    doc = _fixture()
    doc["items"][2]["spec"]["nodeName"] = "node-b"
    r = _k8s(one_berthd, "lease", str(_write(tmp_path, doc)), "--node", "node-a")
    assert r.returncode == 2 and "not on this node" in r.stderr, r.stderr
    assert "node 'node-b''s, this is 'node-a'" in r.stderr, r.stderr


@SHARED
def test_plan_reads_stdin_and_makes_no_lease(one_berthd):
    r = subprocess.run([BERTH, "k8s", "lease", "-", "--plan"], env=one_berthd.env,
                       input=SHARES.read_text(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "llm/chat-0-gpu-x7k2p: gpu1 (GPU-5e1a0000-0000-0000-0000-000000002000) 10.0GiB" \
        in r.stdout, r.stdout
    assert not one_berthd.status()["leases"]


def test_berthd_down_is_said_in_one_line(tmp_path):
    env = {"BERTH_SOCKET": str(tmp_path / "none.sock"), "PATH": "/usr/bin:/bin",
           "BERTH_STATE_DIR": str(tmp_path)}
    r = subprocess.run([BERTH, "k8s", "lease", str(SHARES)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "berthd is not reachable" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@SHARED
def test_the_apis_own_lists_whose_items_carry_no_kind(one_berthd, tmp_path):
    """``GET /apis/resource.k8s.io/v1/resourceclaims`` serves a ResourceClaimList whose items
    have no ``kind`` or ``apiVersion``: they are the list's."""
    items = _fixture()["items"]

    def bare(kind):
        return [{k: v for k, v in i.items() if k not in ("kind", "apiVersion")}
                for i in items if i["kind"] == kind]
    claims, slices = tmp_path / "claims.json", tmp_path / "slices.json"
    claims.write_text(json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                                  "metadata": {"resourceVersion": "48240"},
                                  "items": bare("ResourceClaim")}))
    slices.write_text(json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                                  "metadata": {}, "items": bare("ResourceSlice")}))
    r = _k8s(one_berthd, "lease", "--plan", str(claims), str(slices))
    assert r.returncode == 0, r.stderr
    assert "llm/embed-0-gpu-q9m4d: gpu1 (GPU-5e1a0000-0000-0000-0000-000000002000) 6.0GiB" \
        in r.stdout, r.stdout


def _start(d, tmp_path: Path, name: str, *files) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([BERTH, "k8s", "lease", *map(str, files)], env=d.env,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def test_a_share_that_does_not_fit_waits_and_a_stop_then_releases_it(berthd, tmp_path):
    """The scheduler allocated 10 + 6 + 20 GiB of gpu-1's 24 (NVIDIA publishes the card's
    total); Berth keeps the card's 1 GiB reserve, so the third share waits."""
    d = berthd(cards=TWO_CARDS)
    first, first_log = _start(d, tmp_path, "first", SHARES)
    procs = [first]
    try:
        wait_for(lambda: "holding 2 leases" in first_log.read_text() or first.poll() is not None,
                 60, "the first two leases held")
        doc = _fixture()
        big = copy.deepcopy(doc["items"][0])
        big["metadata"]["name"] = "big-0-gpu-h3n8w"
        big["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {
            "memory": "20Gi"}
        doc["items"] = [big, doc["items"][2]]
        second, second_log = _start(d, tmp_path, "second", _write(tmp_path, doc))
        procs.append(second)

        def waiting():
            le = [x for x in d.status()["leases"] if x["engine"] == "k8s:llm/big-0-gpu-h3n8w"]
            return le and le[0]["shares"][0]["state"] == "waiting" and le[0]["shares"][0]
        share = wait_for(waiting, 60, "the 20 GiB share to wait")
        assert (share["card"], share["size_bytes"]) == (GPU1, 20 * GiB)
        assert second.poll() is None, second_log.read_text()
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0, second_log.read_text()
        assert "stopped while lease" in second_log.read_text()
        wait_for(lambda: "k8s:llm/big-0-gpu-h3n8w" not in _leases(d), 30,
                 "the waiting lease released")
        assert set(_leases(d)) == {"k8s:llm/chat-0-gpu-x7k2p", "k8s:llm/embed-0-gpu-q9m4d"}
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0, first_log.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
