"""PCI addresses as one key per card: a leaf module, so that the short processes that read the
simulated cards (the stand-in cuda-checkpoint, the stub engine) do not build
:mod:`berth.decide.model`'s dataclasses to parse an address (issue 38).

Source: reference/park-mechanisms.md "PCI bus IDs". :mod:`berth.decide.model` re-exports
:func:`normalize_pci`.
"""

from __future__ import annotations

import re

__all__ = ["normalize_pci"]

_PCI_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_pci(text: str | bytes) -> str:
    """Normalise a PCI address so every spelling of one card is one key.

    ``"00000000:05:00.0"`` (NVML ``busId``), ``"0000:05:00.0"`` (sysfs, ``busIdLegacy``),
    ``"05:00.0"`` and upper or lower case all give ``"0000:05:00.0"``. ``bytes`` from older
    pynvml bindings are decoded. Raises ``ValueError`` naming the value otherwise.
    Source: reference/park-mechanisms.md "PCI bus IDs".
    """
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    m = _PCI_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"pci: expected a PCI address like '0000:05:00.0', got {text!r}")
    domain, bus, dev, fn = (int(m.group(1) or "0", 16), int(m.group(2), 16),
                            int(m.group(3), 16), int(m.group(4)))
    if dev > 0x1F:
        raise ValueError(f"pci: device number {dev:#x} is out of range in {text!r}")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
