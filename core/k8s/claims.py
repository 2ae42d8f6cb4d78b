"""An allocated ResourceClaim as Berth lease requests: which card, how many bytes.

Source: issue 39; KEP-5075 "DRA Consumable Capacity" (kubernetes/enhancements
keps/sig-scheduling/5075-dra-consumable-capacity, alpha 1.34, beta 1.36), sections
"ResourceClaimStatus's DeviceRequestAllocationResult" and "ResourceSliceSpec's Device".

A claim's ``status.allocation.devices.results[]`` names, for each request, the device the
scheduler chose (``driver``, ``pool``, ``device``), the ``shareID`` of this allocation of a
multi-allocatable device, and ``consumedCapacity``: what the scheduler subtracted from the
device's capacity (the request rounded up by the device's ``requestPolicy``). The result does
not carry the card's UUID: the device's ResourceSlice does, as its ``uuid`` attribute (NVIDIA's
driver, ``gpu.nvidia.com``: device ``gpu-<minor>``; Berth's own slices the same). So:

1. a claim with no ``status.allocation`` is refused (the scheduler has not placed it); with
   the node's name known, a claim whose ``status.allocation.nodeSelector`` names another node
   is left to that node's agent (:func:`allocated_nodes`; the caller skips it);
2. each result of a GPU driver (``drivers``) is looked up in the slices given: the slice of its
   driver and pool with a device of that name; a slice for another node (``spec.nodeName``) is
   "not on this node";
3. the device's ``uuid`` attribute names the card: it must be one of berthd's cards (their
   ``uuid`` in ``berth status --json``), else "not on this node";
4. the result's ``consumedCapacity.memory`` is the share's size; missing or 0 is refused (a
   dedicated device, or NVIDIA's ``unlimited`` mode with no memory request: no size to hold);
5. results on the same card add up to one share (a lease has one share per card).

Results of other drivers (a NIC in the same claim) are left alone, and said.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from berth.decide.units import format_size

from .objects import K8sInputError, quantity_bytes

__all__ = ["Share", "LeasePlan", "plan", "allocated_nodes", "NVIDIA_DRIVER", "BERTH_DRIVER", "GPU_DRIVERS",
           "engine_name"]

#: NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin).
NVIDIA_DRIVER = "gpu.nvidia.com"
#: The driver name Berth's own slices carry (route (b) in docs/scale.md; nothing publishes it).
BERTH_DRIVER = "gpu.berth.dev"
GPU_DRIVERS = (NVIDIA_DRIVER, BERTH_DRIVER)


@dataclass(frozen=True)
class Share:
    """One share of a lease: ``pci``/``card``/``uuid`` of berthd's card, ``size_bytes`` the
    sum of the claim's ``consumedCapacity.memory`` there, ``devices`` the results it holds
    (``driver/pool/device`` and the share ID)."""

    pci: str
    card: str
    uuid: str
    size_bytes: int
    devices: tuple[str, ...]


@dataclass
class LeasePlan:
    """The lease one claim becomes: ``claim`` is ``namespace/name``, ``uid`` the claim's,
    ``shares`` one per card, ``skipped`` results of other drivers, in words."""

    claim: str
    uid: str | None
    shares: list[Share]
    skipped: list[str] = field(default_factory=list)

    @property
    def engine(self) -> str:
        return engine_name(self.claim)

    def body(self, owner_pid: int) -> dict:
        """The ``POST /v1/leases`` body, as ``berth run --size SIZE@CARD`` makes it: one share
        per card, named by PCI address, sized in bytes; the lease's life follows
        ``owner_pid`` (the agent)."""
        return {"engine": self.engine, "owner_pid": owner_pid,
                "shares": [{"card": s.pci, "size": s.size_bytes} for s in self.shares]}

    def words(self) -> str:
        return f"{self.claim}: " + ", ".join(
            f"{s.card} ({s.uuid}) {format_size(s.size_bytes)}" for s in self.shares)


def engine_name(claim: str) -> str:
    """The lease's engine name for claim ``namespace/name``: ``k8s:namespace/name``."""
    return f"k8s:{claim}"


def _device_index(slices: list) -> dict[tuple[str, str, str], tuple[str, object, object]]:
    """``(driver, pool, device) -> (where, slice, device)`` over every slice given."""
    out = {}
    for w, sl in slices:
        spec = sl.spec
        for dev in spec.devices or []:
            out[(spec.driver, spec.pool.name, dev.name)] = (w, sl, dev)
    return out


def allocated_nodes(claim) -> list[str] | None:
    """The nodes a claim's ``status.allocation.nodeSelector`` names by ``metadata.name`` (a
    node-local device's allocation: one node), ``None`` when it names none that way."""
    alloc = claim.status.allocation if claim.status else None
    sel = alloc.node_selector if alloc else None
    names: list[str] = []
    for term in (sel.node_selector_terms or []) if sel else []:
        for f in term.match_fields or []:
            if f.key == "metadata.name" and f.operator == "In":
                names.extend(f.values or [])
    return names or None


def plan(w: str, claim, slices: list, cards: list[dict], node: str | None = None,
         drivers: tuple[str, ...] = GPU_DRIVERS) -> LeasePlan:
    """Steps 1-5 of the module's docstring for ``claim`` (a ``ResourceV1ResourceClaim``;
    ``w`` names it in errors). ``slices``: ``[(where, V1ResourceSlice)]``; ``cards``: berthd's
    (``berth status --json`` ``cards``: ``pci``, ``name``, ``uuid``); ``node``: this node's
    name, when known. Raises :class:`K8sInputError` naming the claim, the field and the
    value."""
    meta = claim.metadata
    name = f"{meta.namespace or 'default'}/{meta.name}" if meta and meta.name else w
    alloc = claim.status.allocation if claim.status else None
    results = alloc.devices.results if alloc and alloc.devices else None
    if not results:                                                                   # (1)
        raise K8sInputError(f"{w}: status.allocation: not allocated (the scheduler has not "
                            f"placed this claim yet); give an allocated claim")
    index = _device_index(slices)
    by_uuid = {c.get("uuid"): c for c in cards if c.get("uuid")}
    sizes: dict[str, int] = {}
    held: dict[str, list[str]] = {}
    skipped = []
    for i, r in enumerate(results):
        at = f"{w}: status.allocation.devices.results[{i}]"
        dev_id = f"{r.driver}/{r.pool}/{r.device}"
        if r.driver not in drivers:
            skipped.append(f"{dev_id} (driver {r.driver} is not a GPU driver Berth reads)")
            continue
        card = _card_of(at, dev_id, r, index, by_uuid, node)                        # (2, 3)
        size = _size_of(at, dev_id, r)                                                # (4)
        sizes[card["pci"]] = sizes.get(card["pci"], 0) + size                          # (5)
        held.setdefault(card["pci"], []).append(dev_id + (f" share {r.share_id}"
                                                          if r.share_id else ""))
    if not sizes:
        raise K8sInputError(f"{w}: status.allocation.devices.results: no device of a GPU "
                            f"driver ({', '.join(drivers)}); left alone: {'; '.join(skipped)}")
    by_pci = {c["pci"]: c for c in cards}
    shares = [Share(pci, by_pci[pci].get("name") or pci, by_pci[pci]["uuid"], b,
                    tuple(held[pci])) for pci, b in sizes.items()]
    return LeasePlan(name, meta.uid if meta else None, shares, skipped)


def _card_of(at: str, dev_id: str, r, index: dict, by_uuid: dict, node: str | None) -> dict:
    """Berth's card for result ``r`` (steps 2 and 3)."""
    found = index.get((r.driver, r.pool, r.device))
    if found is None:
        raise K8sInputError(
            f"{at}: device {dev_id} is in no ResourceSlice given, so its card's UUID is unknown; "
            f"give this node's slices with the claim (kubectl get resourceslices "
            f"--field-selector spec.nodeName=NODE -o yaml)")
    w, sl, dev = found
    slice_node = sl.spec.node_name
    if node and slice_node and slice_node != node:
        raise K8sInputError(f"{at}: device {dev_id} is not on this node: its slice ({w}) is "
                            f"node {slice_node!r}'s, this is {node!r}")
    attr = (dev.attributes or {}).get("uuid")
    uuid = attr.string if attr is not None else None
    if not uuid:
        raise K8sInputError(f"{at}: device {dev_id} has no 'uuid' attribute in its slice "
                            f"({w}), so Berth cannot tell which card it is")
    if uuid not in by_uuid:
        known = ", ".join(f"{c.get('name')} ({u})" for u, c in by_uuid.items()) or "none"
        raise K8sInputError(f"{at}: device {dev_id} (uuid {uuid}) is not on this node: "
                            f"berthd's cards are {known}")
    return by_uuid[uuid]


def _size_of(at: str, dev_id: str, r) -> int:
    """The share's bytes for result ``r`` (step 4)."""
    consumed = r.consumed_capacity or {}
    if "memory" not in consumed:
        raise K8sInputError(
            f"{at}.consumedCapacity.memory: missing (device {dev_id} was allocated without a "
            f"memory capacity: a dedicated device, or a driver not publishing "
            f"allowMultipleAllocations with a memory capacity, such as NVIDIA's "
            f"--consumable-shares=memory); Berth leases a share only of a known size")
    size = quantity_bytes(consumed["memory"], f"{at}.consumedCapacity.memory")
    if size <= 0:
        raise K8sInputError(
            f"{at}.consumedCapacity.memory: {consumed['memory']!r} consumes nothing (a claim "
            f"with no capacity.requests.memory under NVIDIA's --consumable-shares=unlimited); "
            f"ask capacity.requests.memory in the claim")
    return size
