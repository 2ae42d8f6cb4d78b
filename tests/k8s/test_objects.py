"""berth.k8s.objects without a cluster or a berthd: quantities, and a client too old to carry
KEP-5075's fields named rather than its fields dropped (issue 39)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from berth.k8s.objects import K8sInputError, K8sMissing, check_client, quantity_bytes

GiB = 1 << 30


def test_quantities_as_the_api_writes_them_round_up_to_whole_bytes():
    assert quantity_bytes("10Gi", "f") == 10 * GiB
    assert quantity_bytes("1.5Gi", "f") == 3 * GiB // 2
    assert quantity_bytes("500M", "f") == 500 * 10**6
    assert quantity_bytes("1k", "f") == 1000
    assert quantity_bytes("0.5", "f") == 1
    for bad in ("ten gigs", "-1Gi", "", None):
        with pytest.raises(K8sInputError, match="f: "):
            quantity_bytes(bad, "f")


def _client(**drop):
    """A stand-in ``kubernetes.client`` with the models check_client reads, less ``drop``."""
    import kubernetes.client as real
    names = ("V1DeviceRequestAllocationResult", "V1Device", "V1DeviceCapacity")
    models = {n: type(n, (), {"openapi_types": {k: v for k, v in getattr(real, n)
                                                .openapi_types.items() if k != drop.get(n)}})
              for n in names}
    return types.SimpleNamespace(V1ResourceSlice=real.V1ResourceSlice, **models)


def test_the_installed_client_has_every_field_read():
    check_client(_client())


@pytest.mark.parametrize("model,field", [("V1DeviceRequestAllocationResult", "consumed_capacity"),
                                         ("V1DeviceRequestAllocationResult", "share_id"),
                                         ("V1Device", "allow_multiple_allocations"),
                                         ("V1DeviceCapacity", "request_policy")])
def test_a_client_without_a_field_is_named(model, field):
    with pytest.raises(K8sMissing, match=rf"has no {model}\.{field} .*berth-gpu\[k8s\]"):
        check_client(_client(**{model: field}))


def test_without_the_client_berth_k8s_says_how_to_get_it(tmp_path):
    """The extra not installed (here: ``kubernetes`` made unimportable in the process)."""
    shares = Path(__file__).resolve().parent / "nvidia-memory-shares.yaml"
    code = ("import sys; sys.modules['kubernetes'] = None\n"
            "from berth.cli import main\n"
            f"sys.exit(main(['k8s', 'lease', {str(shares)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == ("berth k8s: the kubernetes client is not installed; install the "
                                "k8s extra: pip install 'berth-gpu[k8s]'"), r.stderr
