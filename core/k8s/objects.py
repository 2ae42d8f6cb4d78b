"""Kubernetes objects as the API serves them, read into the ``kubernetes`` client's models.

Source: issue 39. Input is what ``kubectl get resourceclaims,resourceslices -o yaml`` (or
``-o json``) prints, or the API's own answer (``GET /apis/resource.k8s.io/v1/resourceclaims``):
one object, several YAML documents, or a ``List`` / ``ResourceClaimList`` / ``ResourceSliceList``
whose items the API serves without ``kind`` and ``apiVersion`` (they are the list's).

Only ``resource.k8s.io/v1`` is read (Kubernetes 1.34+: the version that carries KEP-5075's
``allowMultipleAllocations``, ``consumedCapacity`` and ``shareID``). Each object is checked by
deserialising it with the client's own models: ``ResourceV1ResourceClaim`` (the client names
resource.k8s.io/v1's ResourceClaim so, beside core/v1's) and ``V1ResourceSlice``. Client 37.0.2
(OpenAPI document release-1.37) has every field used here; :func:`check_client` names the field
when an older client lacks one. Every failure is a :class:`K8sInputError`: one line naming the
source, the object, the field and the value.
"""

from __future__ import annotations

import math
import reprlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["K8sInputError", "K8sMissing", "Loaded", "API_VERSION", "load", "read_documents",
           "models", "quantity_bytes", "check_client", "where"]

#: The one API version read and written (DRA's GA version, Kubernetes 1.34).
API_VERSION = "resource.k8s.io/v1"

#: How to get the client, as every "missing" message ends.
INSTALL = "install the k8s extra: pip install 'berth-gpu[k8s]'"


class K8sInputError(ValueError):
    """Input Berth cannot use: the message names where, the field and the value."""


class K8sMissing(RuntimeError):
    """The ``kubernetes`` client is not installed, or lacks a field Berth reads."""


def models():
    """The client's module (``kubernetes.client``). Raises :class:`K8sMissing`."""
    try:
        import kubernetes.client as client
    except ImportError:
        raise K8sMissing(f"the kubernetes client is not installed; {INSTALL}") from None
    check_client(client)
    return client


#: Fields of resource.k8s.io/v1 Berth reads, by model (KEP-5075's fields were added to the
#: client with the 1.34 API; an older client would silently drop them on deserialising).
_NEEDED = {"V1DeviceRequestAllocationResult": ("consumed_capacity", "share_id"),
           "V1Device": ("allow_multiple_allocations", "capacity"),
           "V1DeviceCapacity": ("request_policy",)}


def check_client(client) -> None:
    """Raise :class:`K8sMissing` naming the model and field when the installed client lacks
    one Berth reads (and would drop it without a word)."""
    import kubernetes
    version = getattr(kubernetes, "__version__", "?")
    if not callable(getattr(getattr(client, "V1ResourceSlice", None), "from_dict", None)):
        raise K8sMissing(f"kubernetes client {version} has no V1ResourceSlice.from_dict "
                         f"(its models check input from 37.0 on); {INSTALL}")
    for model, fields in _NEEDED.items():
        cls = getattr(client, model, None)
        have = set(getattr(cls, "openapi_types", {}) or {})
        for f in fields:
            if cls is None or f not in have:
                raise K8sMissing(f"kubernetes client {version} has no {model}.{f} "
                                 f"(resource.k8s.io/v1, Kubernetes 1.34+); {INSTALL}")


def where(source: str, doc: dict, index: int | None = None) -> str:
    """``"claims.yaml: ResourceClaim default/a"``: how errors name an object."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name") or (f"item {index}" if index is not None else "(no name)")
    ns = meta.get("namespace")
    return f"{source}: {doc.get('kind') or 'object'} {f'{ns}/' if ns else ''}{name}"


def read_documents(paths: list[str]) -> list[tuple[str, dict]]:
    """Every object in ``paths`` (``-`` is stdin), Lists flattened: ``[(source, object)]``.
    Raises :class:`K8sInputError` for a file that cannot be read or parsed."""
    import yaml
    out: list[tuple[str, dict]] = []
    for path in paths:
        source = "stdin" if path == "-" else path
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise K8sInputError(f"{source}: cannot read: {getattr(e, 'strerror', None) or e}") \
                from None
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise K8sInputError(f"{source}: not JSON or YAML{at}: "
                                f"{getattr(e, 'problem', None) or e}") from None
        for doc in docs:
            out.extend((source, d) for d in _flatten(source, doc))
    return out


def _flatten(source: str, doc: Any) -> list[dict]:
    if not isinstance(doc, dict):
        raise K8sInputError(f"{source}: expected Kubernetes objects (mappings with kind), got "
                            f"{type(doc).__name__}")
    kind = doc.get("kind")
    if not (isinstance(kind, str) and kind.endswith("List") and "items" in doc):
        return [doc]
    items = doc.get("items") or []
    if not isinstance(items, list):
        raise K8sInputError(f"{source}: {kind}.items: expected a list, got "
                            f"{type(items).__name__}")
    # The API serves list items without kind and apiVersion: they are the list's.
    item_kind = kind[:-4] or None
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise K8sInputError(f"{source}: {kind}.items[{i}]: expected an object, got "
                                f"{type(item).__name__}")
        item = dict(item)
        if item_kind:
            item.setdefault("kind", item_kind)
        if doc.get("apiVersion") and doc.get("apiVersion") != "v1":
            item.setdefault("apiVersion", doc["apiVersion"])
        out.extend(_flatten(source, item))
    return out


@dataclass
class Loaded:
    """Objects read: ``claims`` as ``(where, ResourceV1ResourceClaim)``, ``slices`` as
    ``(where, V1ResourceSlice)``, ``other`` the kinds left alone (``where`` strings)."""

    claims: list
    slices: list
    other: list[str]


def load(paths: list[str]) -> Loaded:
    """Read ``paths`` and deserialise each ResourceClaim and ResourceSlice with the client's
    models. Raises :class:`K8sInputError` (a wrong apiVersion, a field of the wrong type, a
    required field missing) and :class:`K8sMissing`."""
    client = models()
    out = Loaded([], [], [])
    for i, (source, doc) in enumerate(read_documents(paths)):
        w = where(source, doc, i)
        kind = doc.get("kind")
        if kind not in ("ResourceClaim", "ResourceSlice"):
            out.other.append(w)
            continue
        if doc.get("apiVersion") != API_VERSION:
            raise K8sInputError(f"{w}: apiVersion: expected {API_VERSION!r} (Kubernetes 1.34+), "
                                f"got {doc.get('apiVersion')!r}")
        model = (client.ResourceV1ResourceClaim if kind == "ResourceClaim"
                 else client.V1ResourceSlice)
        obj = deserialise(model, doc, w)
        (out.claims if kind == "ResourceClaim" else out.slices).append((w, obj))
    return out


def deserialise(model, doc: dict, w: str):
    """``model.from_dict(doc)``; a validation error becomes one :class:`K8sInputError` line
    with the field's path (the API's camelCase names) and the value."""
    from pydantic import ValidationError
    try:
        return model.from_dict(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        value = err.get("input")
        shown = reprlib.repr(value)
        from berth.config.errors import in_words
        raise K8sInputError(f"{w}: {e.title}.{loc}: {in_words(err)} "
                            f"(got {shown})") from None


def quantity_bytes(text: Any, field: str) -> int:
    """A Kubernetes quantity (``"10Gi"``, ``"500M"``, ``"1.5Gi"``, ``"10737418240"``) as whole
    bytes, rounded up. Raises :class:`K8sInputError` naming ``field`` and the value."""
    from kubernetes.utils.quantity import parse_quantity
    try:
        q = parse_quantity(text)
    except (ValueError, TypeError, ArithmeticError):
        raise K8sInputError(f"{field}: expected a quantity such as '10Gi', got {text!r}") from None
    if q < 0:
        raise K8sInputError(f"{field}: expected a quantity of 0 or more, got {text!r}")
    return int(math.ceil(q))
