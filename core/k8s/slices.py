"""The ResourceSlice Berth would publish for this node's cards (route (b) of docs/scale.md).

Source: issue 39; Kubernetes 1.34 resource.k8s.io/v1 ``ResourceSlice`` (``spec.driver``,
``spec.nodeName``, ``spec.pool``, ``spec.devices[]`` with ``attributes`` and ``capacity``);
KEP-5075 "ResourceSliceSpec's Device" (``allowMultipleAllocations``, ``DeviceCapacity.
requestPolicy``). The device's shape copies NVIDIA's DRA driver in ``--consumable-shares=memory``
mode (kubernetes-sigs/dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/consumable_shares.go``:
a ``memory`` capacity rounded down to 1 MiB, ``validRange`` from 1 Mi to the capacity in steps
of 1 Mi, ``default`` the capacity) and its attribute names (``deviceinfo.go``: ``type``,
``uuid``, ``productName``; the standard ``resource.kubernetes.io/pciBusID``), so a DeviceClass
and CEL selectors written for one read the other.

One difference, on purpose: the ``memory`` capacity is what Berth can grant on the card (its
total less the card's ``reserve`` and ``claims`` in berth.toml), not its total, so the
scheduler never allocates bytes the agent would then refuse. (The card's baseline, measured by
berthd, is not known here; berthd refuses a share that does not fit beside it.)
"""

from __future__ import annotations

import re

from berth.driver.base import CardInfo

__all__ = ["MiB", "device_name", "slice_dict", "build", "quantity"]

MiB = 1 << 20
GiB = 1 << 30
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def quantity(n_bytes: int) -> str:
    """Bytes as the API writes a binary quantity: ``"23Gi"``, ``"1536Mi"``, else bytes."""
    if n_bytes and n_bytes % GiB == 0:
        return f"{n_bytes // GiB}Gi"
    if n_bytes and n_bytes % MiB == 0:
        return f"{n_bytes // MiB}Mi"
    return str(n_bytes)


def device_name(card_name: str, index: int) -> str:
    """The card's short name when it is a DNS label (``gpu0``), else ``gpu-<index>``."""
    name = card_name.lower()
    return name if _LABEL.match(name) else f"gpu-{index}"


def slice_dict(node: str, driver: str, cards: list[tuple[CardInfo, str, int]]) -> dict:
    """The ResourceSlice as the API would serve it: ``cards`` is ``[(info, short name,
    grantable bytes)]``. One pool named after the node, one slice, generation 1."""
    devices = []
    for info, name, budget in cards:
        cap = max(MiB, budget // MiB * MiB)
        devices.append({
            "name": device_name(name, info.index),
            "allowMultipleAllocations": True,
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": info.uuid},
                "productName": {"string": info.model},
                "resource.kubernetes.io/pciBusID": {"string": info.pci},
                "berthCard": {"string": name},
                "index": {"int": info.index},
            },
            "capacity": {"memory": {
                "value": quantity(cap),
                "requestPolicy": {"default": quantity(cap), "validRange": {
                    "min": quantity(MiB), "max": quantity(cap), "step": quantity(MiB)}},
            }},
        })
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver.replace('.', '-')}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def build(node: str, driver: str, cards: list[tuple[CardInfo, str, int]]):
    """:func:`slice_dict`, deserialised and checked with the client's ``V1ResourceSlice`` and
    serialised back by the client (``ApiClient.sanitize_for_serialization``): the dict the
    client itself would send. Raises :class:`~berth.k8s.objects.K8sInputError` (a node or
    driver name the model refuses) and :class:`~berth.k8s.objects.K8sMissing`."""
    from .objects import deserialise, models
    client = models()
    body = slice_dict(node, driver, cards)
    obj = deserialise(client.V1ResourceSlice, body, f"ResourceSlice {body['metadata']['name']}")
    return obj, client.ApiClient().sanitize_for_serialization(obj)
