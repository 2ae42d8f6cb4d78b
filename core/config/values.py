"""berth.toml's values on their own: sizes, durations, addresses (pydantic annotated types).

Source: DESIGN.md "Config"; issue 4. Sizes are strings with binary units (``"24GiB"``) or the
word ``card``; durations are strings like ``"20s"``. Inside, every size is bytes and every
duration seconds. Each validator raises ``ValueError`` naming the field and the value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from berth.decide.pci import normalize_pci
from berth.decide.units import parse_duration, parse_size
from pydantic import BeforeValidator

#: No card has more memory than this: a larger size is a typo (a unit slipped).
MAX_CARD_BYTES = 1 << 50
#: The shortest ``read_interval``: berthd reads the driver that often when idle.
MIN_READ_INTERVAL_S = 0.05
#: A card's reserve when its ``[cards.X]`` entry names none (or it has no entry), in bytes.
DEFAULT_RESERVE_BYTES = 512 << 20


def _not_absurd(n: int | None, v: Any, field: str) -> None:
    if n is not None and n > MAX_CARD_BYTES:
        raise ValueError(f"{field}: {v!r} is more than 1 PiB: no card has that much memory "
                         f"(a unit typo?)")


def _with_unit(v: Any, field: str) -> Any:
    """Refuse a bare number other than 0 (``size = 14``, ``"14"``): berth.toml's sizes carry
    their unit, and 14 read as bytes would lease nothing for an engine meant to hold 14 GiB."""
    bare = (isinstance(v, int) and not isinstance(v, bool)) or \
        (isinstance(v, str) and v.strip().isdigit())
    if bare and int(v) != 0:
        raise ValueError(f"{field}: {v!r} has no unit; write '{int(v)}GiB' or '{int(v)}MiB' "
                         f"(or '{int(v)}B' for bytes)")
    return v


def _size(v: Any) -> int:
    return parse_size(_with_unit(v, "size"), field="size")


def _mem(v: Any) -> int:
    """A size on a card: bytes, at most 1 PiB."""
    n = parse_size(_with_unit(v, "size"), field="size")
    _not_absurd(n, v, "size")
    return n


def _opt_mem(v: Any) -> int | None:
    return None if v is None else _mem(v)


def _total(v: Any) -> int:
    n = parse_size(_with_unit(v, "total"), field="total")
    if n == 0:
        raise ValueError(f"total: a card needs some memory, got {v!r}")
    _not_absurd(n, v, "total")
    return n


def _engine_size(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, str) and "@" in v:
        # `berth run --size 14GiB@gpu1` is the README's form; in an entry the card has a key
        # of its own, which the size's own message would not say.
        size, _, card = v.partition("@")
        raise ValueError(f"size: {v!r}: an [engines] entry names its card in its own key, "
                         f"not after '@' (that is `berth run --size`); write "
                         f"size = \"{size.strip()}\" and card = \"{card.strip()}\"")
    n = parse_size(_with_unit(v, "size"), field="size", allow_card=True)
    if n == 0:
        raise ValueError(f"size: an engine's size must be more than 0, got {v!r} "
                         f"(size = 'card' asks for the whole card)")
    _not_absurd(n, v, "size")
    return n


def _rate(v: Any) -> int:
    # A rate is bytes per second, so a bare number is read as that (the default is written
    # 7_000_000_000); only sizes must carry a unit.
    n = parse_size(v, field="checkpoint_rate")
    if n == 0:
        raise ValueError(f"checkpoint_rate: must be more than 0 bytes per second, got {v!r}")
    return n


def _ram(v: Any) -> int | str:
    if v == "auto":
        return v
    try:
        return parse_size(_with_unit(v, "ram_budget"), field="ram_budget")
    except ValueError as e:
        # the size's own error, and the word a user who wrote a share or a percentage wants
        raise ValueError(f"{e}; or 'auto' (the default: 80% of the host RAM available when "
                         "berthd starts)") from None


def _parse_dur(v: Any, field: str) -> float:
    if isinstance(v, str) and v.strip().startswith("-"):
        raise ValueError(f"{field}: a duration cannot be negative, got {v!r}")
    return parse_duration(v, field=field)


def _dur(v: Any) -> float:
    return _parse_dur(v, "duration")


def _positive_dur(v: Any) -> float:
    s = _parse_dur(v, "duration")
    if s <= 0:
        raise ValueError(f"duration: must be more than 0, got {v!r}")
    return s


def _read_interval(v: Any) -> float:
    s = _parse_dur(v, "read_interval")
    if s < MIN_READ_INTERVAL_S:
        raise ValueError(f"read_interval: must be at least 50ms, got {v!r}: berthd reads the "
                         f"driver this often when idle (and at once after every event anyway), "
                         f"so a shorter interval only keeps a CPU core busy (0 spins it at 100%)")
    return s


#: The largest whole number berth.toml takes (a count of connections, sessions, ...): every
#: number from outside is bounded before use (issue 36).
MAX_WHOLE = 1 << 31


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected a whole number like 10, got {v!r}")
    if not 0 <= v <= MAX_WHOLE:
        raise ValueError(f"expected a whole number from 0 to {MAX_WHOLE}, got {v!r}")
    return v


def _priority(v: Any) -> int:
    """A priority: a whole number from -1000 to 1000, the range the control API accepts."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected a whole number like 10, got {v!r}")
    if not -1000 <= v <= 1000:
        raise ValueError(f"expected a priority from -1000 to 1000, got {v!r}")
    return v


def _opt_priority(v: Any) -> int | None:
    return None if v is None else _priority(v)


def _pci(v: Any) -> str:
    return normalize_pci(v) if isinstance(v, (str, bytes)) else normalize_pci(repr(v))


def _card_key(v: Any) -> str | None:
    """An engine's ``card``: a short name, or a PCI address (normalised, as berthd keys it)."""
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"card: expected a card's name or PCI address like 'gpu0' or "
                         f"'0000:01:00.0', got {v!r}")
    try:
        return normalize_pci(v)
    except ValueError:
        return v


def _tcp(v: Any) -> str | None:
    if v is None:
        return None
    ok = isinstance(v, str)
    if ok:
        host, sep, port = v.strip().rpartition(":")
        ok = (bool(sep) and port.isdigit() and 1 <= int(port) <= 65535
              and not any(c.isspace() for c in host))
    if not ok:
        raise ValueError(f"expected HOST:PORT like '127.0.0.1:7878', with a port from 1 to 65535, "
                         f"got {v!r}")
    return v.strip()


Size = Annotated[int, BeforeValidator(_size)]
CardBytes = Annotated[int, BeforeValidator(_mem)]
OptCardBytes = Annotated[int | None, BeforeValidator(_opt_mem)]
Total = Annotated[int, BeforeValidator(_total)]
EngineSize = Annotated[int | None, BeforeValidator(_engine_size)]
Rate = Annotated[int, BeforeValidator(_rate)]
RamBudget = Annotated[int | Literal["auto"], BeforeValidator(_ram)]
Duration = Annotated[float, BeforeValidator(_dur)]
PositiveDuration = Annotated[float, BeforeValidator(_positive_dur)]
ReadInterval = Annotated[float, BeforeValidator(_read_interval)]
Whole = Annotated[int, BeforeValidator(_whole)]
Priority = Annotated[int, BeforeValidator(_priority)]
OptPriority = Annotated[int | None, BeforeValidator(_opt_priority)]
Pci = Annotated[str, BeforeValidator(_pci)]
CardKey = Annotated[str | None, BeforeValidator(_card_key)]
TcpAddress = Annotated[str | None, BeforeValidator(_tcp)]


def _listen(v: Any) -> str | None:
    """``[board] listen``: ``HOST:PORT``, or ``"off"`` (``None``): no board listener."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("off", "")):
        return None
    return _tcp(v)


Listen = Annotated[str | None, BeforeValidator(_listen)]




def _socket_mode(v: Any) -> int:
    """``[api] socket_mode``: a file mode, as TOML's octal integer (``0o660``) or a string of
    octal digits (``"0660"``); the owner (berthd) keeps read and write."""
    mode, said = None, repr(v)
    if isinstance(v, int) and not isinstance(v, bool):
        mode, said = v, oct(v)
    elif isinstance(v, str) and v.strip():
        text = v.strip().lower().removeprefix("0o")
        if text and all(c in "01234567" for c in text):
            mode = int(text, 8)
    if mode is None or not 0 <= mode <= 0o777:
        if isinstance(v, int) and all(c in "01234567" for c in str(mode)) and \
                int(str(mode), 8) <= 0o777:
            # `socket_mode = 660`: TOML reads it as decimal, so show it as written too
            raise ValueError(f"got {mode}, which TOML reads as a decimal number ({said}); "
                             f"write 0o{mode} (or \"0{mode}\") for the octal mode")
        raise ValueError(f"expected a file mode like 0o660 or \"0660\", got {said}")
    if mode & 0o600 != 0o600:
        raise ValueError(f"{oct(mode)} takes read and write from the socket's owner (berthd); "
                         f"expected a mode like 0o660, got {said}")
    return mode


SocketMode = Annotated[int, BeforeValidator(_socket_mode)]
