"""Human sizes and durations, parsed only at the edges (config, CLI, API bodies).

Inside Berth every size is an ``int`` of bytes (names end in ``_bytes``) and every duration a
``float`` of seconds (names end in ``_s``). Source: DESIGN.md "The public surface".
"""

from __future__ import annotations

import re

__all__ = ["WHOLE_CARD", "parse_size", "parse_duration", "format_size", "format_duration"]

#: The word a size may be instead of a number: the whole card (DESIGN.md, ``size = "card"``).
WHOLE_CARD = "card"

_BINARY = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
           "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# Decimal units mean what they say: "24GB" is 24e9 bytes, not 24 GiB.
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)")
_DUR_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str | int, *, field: str = "size", allow_card: bool = False) -> int | None:
    """Parse ``"24GiB"``, ``"512MiB"``, ``"1.5GiB"``, ``"24GB"`` or a bare byte count.

    Returns bytes as an ``int``; returns ``None`` for the word ``card`` when ``allow_card``.
    Raises ``ValueError`` naming ``field`` and the value for anything else (negative numbers,
    unknown units, empty strings).
    """
    if isinstance(text, bool):
        raise ValueError(f"{field}: expected a size like '24GiB', got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{field}: a size cannot be negative, got {text!r}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"{field}: expected a size like '24GiB', got {text!r}")
    if text.strip().lower() == WHOLE_CARD:
        if allow_card:
            return None
        raise ValueError(f"{field}: 'card' is not allowed here, give bytes like '24GiB'")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{field}: expected a size like '24GiB' or '512MiB', got {text!r}")
    number, unit = float(m.group(1)), m.group(2).lower()
    scale = _BINARY.get(unit) or _DECIMAL.get(unit)
    if scale is None:
        raise ValueError(
            f"{field}: unknown unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB (or KB, MB, GB)")
    return int(round(number * scale))


def parse_duration(text: str | int | float, *, field: str = "duration") -> float:
    """Parse ``"20s"``, ``"500ms"``, ``"2m"``, ``"1h30m"`` or a bare number of seconds.

    Returns seconds as a ``float``. Raises ``ValueError`` naming ``field`` and the value.
    """
    if isinstance(text, bool):
        raise ValueError(f"{field}: expected a duration like '20s', got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{field}: a duration cannot be negative, got {text!r}")
        return float(text)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field}: expected a duration like '20s' or '500ms', got {text!r}")
    s = text.strip().lower()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value < 0:
            raise ValueError(f"{field}: a duration cannot be negative, got {text!r}")
        return value
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_UNIT[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"{field}: expected a duration like '20s', '500ms', '2m' or '1h', got {text!r}")
    return total


def format_size(n_bytes: int | None) -> str:
    """Render bytes for people: ``25769803776`` -> ``"24.0GiB"``; ``None`` -> ``"card"``."""
    if n_bytes is None:
        return WHOLE_CARD
    sign = "-" if n_bytes < 0 else ""
    n = abs(n_bytes)
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:.1f}{unit}"
    return f"{sign}{n}B"


def format_duration(seconds: float) -> str:
    """Render seconds for people: ``0.0123`` -> ``"12ms"``, ``3.3`` -> ``"3.30s"``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    return f"{seconds / 60:.1f}m"
