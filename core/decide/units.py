"""Human sizes and durations, parsed only at the edges (config, CLI, API bodies).

Inside Berth every size is an ``int`` of bytes (names end in ``_bytes``) and every duration a
``float`` of seconds (names end in ``_s``). Source: DESIGN.md "The public surface".
"""

from __future__ import annotations

import re

__all__ = ["WHOLE_CARD", "MAX_BYTES", "MAX_DURATION_S", "parse_size", "parse_duration",
           "format_size", "format_duration"]

#: The word a size may be instead of a number: the whole card (DESIGN.md, ``size = "card"``).
WHOLE_CARD = "card"

_BINARY = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
           "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# Decimal units mean what they say: "24GB" is 24e9 bytes, not 24 GiB.
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
#: The largest size any edge takes (1 EiB): every number from outside is bounded before use, so
#: a 300-digit size is refused by name rather than reaching arithmetic (issue 36).
MAX_BYTES = 1 << 60
#: The longest duration any edge takes (ten years), for the same reason; never infinite.
MAX_DURATION_S = 10 * 365 * 86400.0
#: Digits a number may be written with: enough for any bound above, with decimals.
_MAX_DIGITS = 40
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
#: ``Kb``, ``Mb``, ``Gb``, ``Tb``: bits as network gear writes them, not bytes; refused by name
#: rather than read as ``GB`` (``gb`` in lower case stays decimal bytes, as people type it).
_BITS_RE = re.compile(r"^[KMGT]b$")
_POWERS = {"K": 10, "M": 20, "G": 30, "T": 40}
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)")
_DUR_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _short(value) -> str:
    """A value for an error message, cut short: a 300-digit number is not repeated whole."""
    text = repr(value)
    return text if len(text) <= 48 else f"{text[:40]}...{text[-4:]} ({len(text)} characters)"


def _too_big(field: str, value, what: str) -> ValueError:
    return ValueError(f"{field}: more than {what}, got {_short(value)}")


def parse_size(text: str | int, *, field: str = "size", allow_card: bool = False) -> int | None:
    """Parse ``"24GiB"``, ``"512MiB"``, ``"1.5GiB"``, ``"24GB"`` or a bare byte count.

    Returns bytes as an ``int`` from 0 to :data:`MAX_BYTES`; returns ``None`` for the word
    ``card`` when ``allow_card``. Raises ``ValueError`` naming ``field`` and the value for
    anything else (negative numbers, more than :data:`MAX_BYTES` or than 40 digits, unknown
    units, bits such as ``"14Gb"``, empty strings). Source: issue 36 "Huge numbers".
    """
    if isinstance(text, bool):
        raise ValueError(f"{field}: expected a size like '24GiB', got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{field}: a size cannot be negative, got {_short(text)}")
        if text > MAX_BYTES:
            raise _too_big(field, text, "1 EiB")
        return text
    if not isinstance(text, str):
        raise ValueError(f"{field}: expected a size like '24GiB', got {text!r}")
    if text.strip().lower() == WHOLE_CARD:
        if allow_card:
            return None
        raise ValueError(f"{field}: 'card' is not allowed here, give bytes like '24GiB'")
    if len(text) > _MAX_DIGITS + 8:
        raise _too_big(field, text, "1 EiB")
    m = _SIZE_RE.match(text)
    if not m:
        if _SIZE_RE.match(text.strip().removeprefix("-").lstrip()):
            raise ValueError(f"{field}: a size cannot be negative, got {text!r}")
        raise ValueError(f"{field}: expected a size like '24GiB' or '512MiB', got {text!r}")
    if _BITS_RE.match(m.group(2)):
        p = m.group(2)[0]
        raise ValueError(f"{field}: {text!r}: {m.group(2)!r} reads as bits; write {p}iB "
                         f"(2^{_POWERS[p]} bytes) or {p}B (10^{_POWERS[p] * 3 // 10} bytes)")
    number, unit = float(m.group(1)), m.group(2).lower()
    scale = _BINARY.get(unit) or _DECIMAL.get(unit)
    if scale is None:
        raise ValueError(
            f"{field}: unknown unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB (or KB, MB, GB)")
    if not number * scale <= MAX_BYTES:
        raise _too_big(field, text, "1 EiB")
    return int(round(number * scale))


def parse_duration(text: str | int | float, *, field: str = "duration") -> float:
    """Parse ``"20s"``, ``"500ms"``, ``"2m"``, ``"1h30m"`` or a bare number of seconds.

    Returns seconds as a finite ``float`` from 0 to :data:`MAX_DURATION_S`. Raises
    ``ValueError`` naming ``field`` and the value (negative, infinite, not a number, longer than
    ten years, malformed). Source: issue 36 "Huge numbers".
    """
    if isinstance(text, bool):
        raise ValueError(f"{field}: expected a duration like '20s', got {text!r}")
    if isinstance(text, (int, float)):
        if text != text:
            raise ValueError(f"{field}: expected a number of seconds, got {text!r}")
        if text < 0:
            raise ValueError(f"{field}: a duration cannot be negative, got {_short(text)}")
        if text > MAX_DURATION_S:
            raise _too_big(field, text, "ten years")
        return float(text)
    if isinstance(text, str) and len(text) > 4 * _MAX_DIGITS:
        raise _too_big(field, text, "ten years")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field}: expected a duration like '20s' or '500ms', got {text!r}")
    s = text.strip().lower()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value != value:
            raise ValueError(f"{field}: expected a number of seconds, got {text!r}")
        if value < 0:
            raise ValueError(f"{field}: a duration cannot be negative, got {text!r}")
        if value > MAX_DURATION_S:
            raise _too_big(field, text, "ten years")
        return value
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_UNIT[m.group(2)]
        pos = m.end()
    if (pos != len(s) or pos == 0) and s.startswith("-") \
            and parse_ok(lambda: parse_duration(s[1:], field=field)):
        raise ValueError(f"{field}: a duration cannot be negative, got {text!r}")
    if pos != len(s) or pos == 0:
        raise ValueError(f"{field}: expected a duration like '20s', '500ms', '2m' or '1h', got {text!r}")
    if not total <= MAX_DURATION_S:
        raise _too_big(field, text, "ten years")
    return total


def parse_ok(parse) -> bool:
    """Whether ``parse()`` returns without a ``ValueError``."""
    try:
        parse()
    except ValueError:
        return False
    return True


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
