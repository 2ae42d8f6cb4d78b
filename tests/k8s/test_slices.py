"""``berth k8s slices``: the ResourceSlice Berth would publish for this node's simulated cards,
read back with the kubernetes client's own model (issue 39). No cluster runs here."""

from __future__ import annotations

import json
import subprocess

import yaml
from berth.sim.cards import sim_uuid

from tests.berthd import BERTH

CARDS = (("gpu0", "24GiB"), ("gpu1", "48GiB"))


def _slices(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "k8s", "slices", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_two_card_sizes_deserialise_as_a_resource_slice(berthd, tmp_path):
    d = berthd(cards=CARDS, reserve="1GiB", start=False)
    r = _slices(d.env, "--json", "--node", "node-a")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    # Imported here: the kubernetes client's import (0.13 CPU-s) is paid by the worker that
    # runs this test, not by each one that collects it.
    from kubernetes.client import V1ResourceSlice
    sl = V1ResourceSlice.from_dict(body)
    assert (sl.spec.driver, sl.spec.node_name, sl.spec.pool.name) == \
        ("gpu.berth.dev", "node-a", "node-a")
    devices = {dev.name: dev for dev in sl.spec.devices}
    assert sorted(devices) == ["gpu0", "gpu1"]
    for i, (name, total) in enumerate(CARDS):
        dev = devices[name]
        pci = f"0000:{i + 1:02x}:00.0"
        grantable = f"{int(total[:-3]) - 1}Gi"           # the card less its 1 GiB reserve
        assert dev.allow_multiple_allocations is True
        mem = dev.capacity["memory"]
        assert mem.value == grantable
        assert mem.request_policy.default == grantable
        rng = mem.request_policy.valid_range
        assert (rng.min, rng.max, rng.step) == ("1Mi", grantable, "1Mi")
        attrs = {k: (v.string if v.string is not None else v.int) for k, v in
                 dev.attributes.items()}
        assert attrs == {"type": "gpu", "uuid": sim_uuid(pci),
                         "productName": f"Berth sim card {name}",
                         "resource.kubernetes.io/pciBusID": pci, "berthCard": name, "index": i}


def test_yaml_by_default_and_a_claim_on_it_maps_back_to_the_card(berthd, tmp_path):
    d = berthd(cards=CARDS)
    r = _slices(d.env, "--node", "node-a")
    assert r.returncode == 0, r.stderr
    sl = yaml.safe_load(r.stdout)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "big", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu.berth.dev",
                 "capacity": {"requests": {"memory": "30Gi"}}}}]}},
             "status": {"allocation": {"devices": {"results": [{
                 "request": "gpu", "driver": "gpu.berth.dev", "pool": "node-a",
                 "device": "gpu1", "shareID": "0f0e0d0c-0b0a-4908-8706-050403020100",
                 "consumedCapacity": {"memory": "30Gi"}}]}}}}
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump_all([sl, claim]))
    r = subprocess.run([BERTH, "k8s", "lease", "--plan", str(f)], env=d.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"default/big: gpu1 ({sim_uuid('0000:02:00.0')}) 30.0GiB" in r.stdout, r.stdout


def test_a_config_that_does_not_load_is_one_line(tmp_path):
    bad = tmp_path / "berth.toml"
    bad.write_text("[driver]\nkind = 'sim'\n[[driver.cards]]\nname = 'gpu0'\ntotal = 'lots'\n")
    r = _slices({"PATH": "/usr/bin:/bin", "BERTH_STATE_DIR": str(tmp_path)}, "--config", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "lots" in r.stderr, r.stderr
