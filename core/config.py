"""``berth.toml``: the schema (pydantic), and errors that name every bad key and value.

Source: DESIGN.md "Config"; issue 4. Sizes are strings with binary units (``"24GiB"``) or the
word ``card``; durations are strings like ``"20s"``. Inside, every size is bytes and every
duration seconds. :func:`load` raises :class:`ConfigError` listing *every* problem by its key
path, e.g. ``cards.gpu0.reserve: expected a size like '24GiB', got 'lots'``.

Two kinds of check, both reported together: each value on its own (the annotated types below),
and values against each other (:func:`_cross`: a card's reserve against its total, an engine's
size against its card, a ``[cards.X]`` naming a card that is not declared). The second kind
reads the raw document, value by value, so one bad value elsewhere hides nothing.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, TypeAdapter,
                      ValidationError, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from berth.decide.admission import Policy, QueuePolicy
from berth.decide.model import Bound, normalize_pci
from berth.decide.units import format_duration, format_size, parse_duration, parse_size

__all__ = ["Config", "ConfigError", "load", "load_config", "parse", "plugin_problems", "summary",
           "EngineConfig", "DriverConfig", "NetworkConfig"]

#: No card has more memory than this: a larger size is a typo (a unit slipped).
MAX_CARD_BYTES = 1 << 50
#: The shortest ``read_interval``: berthd reads the driver that often when idle.
MIN_READ_INTERVAL_S = 0.05


# -- values on their own -----------------------------------------------------------------------
def _not_absurd(n: int | None, v: Any, field: str) -> None:
    if n is not None and n > MAX_CARD_BYTES:
        raise ValueError(f"{field}: {v!r} is more than 1 PiB: no card has that much memory "
                         f"(a unit typo?)")


def _size(v: Any) -> int:
    return parse_size(v, field="size")


def _mem(v: Any) -> int:
    """A size on a card: bytes, at most 1 PiB."""
    n = parse_size(v, field="size")
    _not_absurd(n, v, "size")
    return n


def _opt_mem(v: Any) -> int | None:
    return None if v is None else _mem(v)


def _total(v: Any) -> int:
    n = parse_size(v, field="total")
    if n == 0:
        raise ValueError(f"total: a card needs some memory, got {v!r}")
    _not_absurd(n, v, "total")
    return n


def _engine_size(v: Any) -> int | None:
    if v is None:
        return None
    n = parse_size(v, field="size", allow_card=True)
    if n == 0:
        raise ValueError(f"size: an engine's size must be more than 0, got {v!r} "
                         f"(size = 'card' asks for the whole card)")
    _not_absurd(n, v, "size")
    return n


def _rate(v: Any) -> int:
    n = parse_size(v, field="checkpoint_rate")
    if n == 0:
        raise ValueError(f"checkpoint_rate: must be more than 0 bytes per second, got {v!r}")
    return n


def _ram(v: Any) -> int | str:
    return "auto" if v == "auto" else parse_size(v, field="ram_budget")


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


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected a whole number like 10, got {v!r}")
    return v


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
Pci = Annotated[str, BeforeValidator(_pci)]
CardKey = Annotated[str | None, BeforeValidator(_card_key)]
TcpAddress = Annotated[str | None, BeforeValidator(_tcp)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimCard(_Strict):
    """A simulated card (``[[driver.cards]]``, sim only). ``pci`` defaults to
    ``0000:<n>:00.0`` for the n-th card (from 1), as ``berth sim init`` picks it."""

    pci: Pci
    name: str
    total: Total
    baseline: CardBytes = 0


class DriverConfig(_Strict):
    """``[driver]``: ``kind`` is ``nvml`` (real cards) or ``sim`` (simulated cards declared in
    ``cards``, shared across processes under ``sim_dir``, default ``$BERTH_SIM_DIR`` or
    ``<state dir>/sim``). ``free_delay`` is how long a simulated card takes to free a dead
    process's memory; ``checkpoint_rate`` the stand-in cuda-checkpoint's bytes per second.
    (Which cards are declared, and whether they fit ``kind``, is checked in :func:`_cross`.)"""

    kind: Literal["nvml", "sim"] = "nvml"
    cards: list[SimCard] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _default_pci(cls, data: Any) -> Any:
        # A card declared without ``pci`` gets the address ``berth sim init`` would give it.
        if isinstance(data, dict) and isinstance(data.get("cards"), list):
            data = {**data, "cards": [
                {**c, "pci": f"0000:{i + 1:02x}:00.0"} if isinstance(c, dict) and "pci" not in c
                else c for i, c in enumerate(data["cards"])]}
        return data
    sim_dir: str | None = None
    free_delay: Duration = 0.5
    checkpoint_rate: Rate = 7_000_000_000
    proc_root: str = "/proc"


class CardConfig(_Strict):
    """``[cards.<name or PCI>]``: ``reserve`` (the floor, never granted), ``claims`` (bytes
    held for users outside Berth), ``baseline`` (overrides the measured baseline), ``name``
    (a short name to show)."""

    reserve: CardBytes = 512 << 20
    claims: dict[str, CardBytes] = Field(default_factory=dict)
    baseline: OptCardBytes = None
    name: str | None = None


class PolicyConfig(_Strict):
    """``[policy]``: see :class:`berth.decide.admission.Policy` for each knob."""

    queue: QueuePolicy = QueuePolicy.SCAN
    scan_max_skips: Whole = Field(8, ge=0)
    scan_max_wait: Duration = 30.0
    release_grace: PositiveDuration = 20.0
    wake_limit: PositiveDuration = 60.0
    wait_limit: PositiveDuration = 120.0
    ram_budget: RamBudget = "auto"
    min_turn: Duration = 10.0
    juggle_window: Duration = 120.0
    juggle_max_swaps: Whole = Field(4, ge=0)
    read_interval: ReadInterval = 1.0
    hook_residual_guess: Size = 2 << 30

    def policy(self) -> Policy:
        return Policy(queue=self.queue, scan_max_skips=self.scan_max_skips,
                      scan_max_wait_s=self.scan_max_wait, release_grace_s=self.release_grace,
                      wake_limit_s=self.wake_limit, wait_limit_s=self.wait_limit,
                      min_turn_s=self.min_turn, juggle_window_s=self.juggle_window,
                      juggle_max_swaps=self.juggle_max_swaps,
                      hook_residual_guess_bytes=self.hook_residual_guess,
                      read_interval_s=self.read_interval)


class EngineConfig(_Strict):
    """``[engines.<name>]``: an engine entry (DESIGN.md "Config", seed 002 "Capabilities").

    ``park = "checkpoint"`` is refused here: checkpoint needs a run's own front, so it goes on a
    ``berth run --front`` line (seed 002). ``park``/``lend`` need a ``front`` (rule 3).
    ``supervisor`` names a supervisord program (issue 7), with ``mode`` observe or gate.
    ``card`` is a card's short name or PCI address (kept normalised, as berthd keys cards).
    """

    url: str | None = None
    front: str | None = None
    park: Literal["hook", "checkpoint"] | None = None
    lend: StrictBool = False
    lend_max: OptCardBytes = None
    adapter: str | None = None
    bound: Bound = Bound.DECLARED
    size: EngineSize = None
    card: CardKey = None
    need: OptCardBytes = None
    growth_allowance: CardBytes = 0
    priority: Whole = 0
    supervisor: str | None = None
    mode: Literal["observe", "gate"] = "observe"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rules(self):
        if self.park == "checkpoint":
            raise ValueError("park = 'checkpoint' is refused on an engine entry: every run of the "
                             "entry would share one front. Put it on a `berth run --front ADDR "
                             "--park checkpoint` line (seed 002 'Capabilities')")
        if (self.park or self.lend) and not self.front:
            raise ValueError("park and lend need a front (rule 3: Berth parks an engine only when "
                             "every request passes through a Berth front); set front = ...")
        if self.park == "hook" and not self.adapter:
            raise ValueError("park = 'hook' needs an adapter (protocol, vllm, sglang, llamacpp, "
                             "comfyui)")
        return self


class ApiConfig(_Strict):
    """``[api]``: the control socket (default ``$BERTH_SOCKET`` or ``<state dir>/berthd.sock``)
    and an optional TCP listener (``HOST:PORT``), which requires a key."""

    socket: str | None = None
    tcp: TcpAddress = None
    key: str | None = None

    @model_validator(mode="after")
    def _tcp_key(self):
        if self.tcp and not self.key:
            raise ValueError("api.tcp needs api.key: the TCP control API is never open without one")
        return self


class SupervisorHostConfig(_Strict):
    """``[hosts.supervisor]``: how berthd reaches supervisord's XML-RPC (``unix:///path.sock``
    or ``http://host:port``)."""

    url: str = "unix:///var/run/supervisor.sock"
    username: str | None = None
    password: str | None = None


class HostsConfig(_Strict):
    supervisor: SupervisorHostConfig | None = None


def _peer_url(v: Any) -> str:
    """A peer gateway: ``HOST:PORT`` or ``http(s)://HOST:PORT`` -> a base URL."""
    if isinstance(v, str):
        u = v.strip().rstrip("/")
        if not u.startswith(("http://", "https://")):
            u = "http://" + u
        host, sep, port = u.split("://", 1)[1].rpartition(":")
        if sep and host and port.isdigit() and 1 <= int(port) <= 65535 and "/" not in host:
            return u
    raise ValueError(f"expected a peer gateway as HOST:PORT or http://HOST:PORT, got {v!r}")


class NetworkConfig(_Strict):
    """``[network]``: many machines (seed 002 "Many machines", issue 14), off until ``peers`` is
    set. ``peers``: the other machines' gateways (``HOST:PORT``); ``key``: the shared secret every
    peer call is signed with (required with peers); ``name``: this machine's name (default its
    host name); ``peer_timeout``: a peer that does not answer within it is skipped; ``peer_retry``:
    how long a peer marked down is skipped before it is asked again; ``peer_poll``: how often
    peers are asked for their engines; ``replay_window``: a signed call older (or newer) than
    this is refused."""

    peers: list[Annotated[str, BeforeValidator(_peer_url)]] = Field(default_factory=list)
    key: str | None = Field(None, min_length=16)
    name: str | None = Field(None, min_length=1, max_length=100)
    peer_timeout: PositiveDuration = 2.0
    peer_retry: PositiveDuration = 10.0
    peer_poll: PositiveDuration = 1.0
    replay_window: PositiveDuration = 30.0

    @model_validator(mode="after")
    def _peers_key(self):
        if self.peers and not self.key:
            raise ValueError("network.peers needs network.key: peer calls are always signed")
        return self


class Config(_Strict):
    """The whole of ``berth.toml``."""

    driver: DriverConfig = Field(default_factory=DriverConfig)
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    api: ApiConfig = Field(default_factory=ApiConfig)
    hosts: HostsConfig = Field(default_factory=HostsConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    state_dir: str | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _whole_file(cls, data: Any, handler):
        """Every value's own errors and every cross-check's, together (the cross-checks read
        the raw document, so they run even when some value is bad)."""
        errors: list[InitErrorDetails] = []
        cfg = None
        try:
            cfg = handler(data)
        except ValidationError as e:
            errors = [InitErrorDetails(type=PydanticCustomError(x["type"], x["msg"]),
                                       loc=x["loc"], input=x.get("input"))
                      for x in e.errors()]
        errors += [InitErrorDetails(type=PydanticCustomError(_CROSS, msg), loc=loc, input=value)
                   for loc, msg, value in _cross(data)]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return cfg

    def card_config(self, pci: str, name: str) -> CardConfig:
        """The ``[cards.X]`` entry for a card, by PCI address or name (default if none)."""
        for key, cc in self.cards.items():
            try:
                if normalize_pci(key) == pci:
                    return cc
            except ValueError:
                pass
            if key == name:
                return cc
        return CardConfig()


# -- values against each other -----------------------------------------------------------------
_CROSS = "berth_config"
_BAD = object()          # a value wrong on its own (already reported): check nothing with it


def _as_dict(x: Any) -> dict | None:
    if isinstance(x, BaseModel):
        return {k: getattr(x, k) for k in x.model_fields_set}
    return x if isinstance(x, dict) else None


@functools.cache
def _adapter(model: type[BaseModel], name: str) -> TypeAdapter:
    f = model.model_fields[name]
    return TypeAdapter(Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation)


def _field(model: type[BaseModel], raw: dict, name: str) -> Any:
    """One field of ``raw`` as ``model`` would have it (its default when absent), or _BAD."""
    if name not in raw:
        return model.model_fields[name].get_default(call_default_factory=True)
    try:
        return _adapter(model, name).validate_python(raw[name])
    except ValidationError:
        return _BAD


def _claim(v: Any) -> Any:
    try:
        return _mem(v)
    except ValueError:
        return _BAD


@dataclass
class _Card:
    """What the cross-checks need of one simulated card and its ``[cards.X]`` entry."""
    i: int
    pci: Any
    name: Any
    total: Any
    sim_baseline: Any
    key: str | None = None                 # its [cards.X] entry, if any
    reserve: Any = CardConfig.model_fields["reserve"].default
    claims: dict = field(default_factory=dict)
    baseline: Any = None                   # [cards.X] baseline (None: measured at start)
    shown: Any = None                      # [cards.X] name

    def known(self) -> bool:
        return isinstance(self.pci, str) and isinstance(self.name, str)

    def where(self, *rest) -> tuple:
        return ("cards", self.key, *rest) if self.key is not None else ("driver", "cards", self.i)

    def base(self) -> Any:
        return self.baseline if self.baseline is not None else self.sim_baseline

    def capacity(self) -> int | None:
        """total − reserve − claims − baseline, or None when one of them is bad."""
        parts = [self.total, self.reserve, self.base(), *self.claims.values()]
        if any(p is _BAD for p in parts):
            return None
        return self.total - self.reserve - self.base() - sum(self.claims.values())

    def sums(self) -> str:
        s = f"{format_size(self.total)} total − {format_size(self.reserve)} reserve"
        if self.claims:
            s += f" − {format_size(sum(self.claims.values()))} claims"
        return s + f" − {format_size(self.base())} baseline"


def _matches(key: str, pci: Any, name: Any) -> bool:
    """Whether a ``[cards.X]`` key names this card (as :meth:`Config.card_config` reads it)."""
    try:
        if normalize_pci(key) == pci:
            return True
    except ValueError:
        pass
    return key == name


def _cross(data: Any) -> list[tuple[tuple, str, Any]]:
    """Problems between values: ``(key path, message, value)``. Reads the raw document."""
    top = _as_dict(data)
    if top is None:
        return []
    out: list[tuple[tuple, str, Any]] = []
    drv = _as_dict(top.get("driver", {})) or {}
    kind = _field(DriverConfig, drv, "kind")
    raw_sims = drv.get("cards", [])
    raw_sims = raw_sims if isinstance(raw_sims, list) else []
    if kind == "sim" and not raw_sims:
        out.append((("driver",), "driver.kind = 'sim' needs at least one [[driver.cards]] entry "
                                 "(pci, name, total)", None))
    if kind == "nvml" and raw_sims:
        out.append((("driver",), "[[driver.cards]] declares simulated cards; set "
                                 "driver.kind = 'sim'", None))
    sims: list[_Card] = []
    for i, rc in enumerate(raw_sims):
        rc = _as_dict(rc)
        if rc is not None:
            sims.append(_Card(i, _field(SimCard, rc, "pci"), _field(SimCard, rc, "name"),
                              _field(SimCard, rc, "total"), _field(SimCard, rc, "baseline")))
    for label in ("name", "pci"):
        seen: dict[str, int] = {}
        for c in sims:
            v = getattr(c, label)
            if isinstance(v, str) and v in seen:
                out.append((("driver", "cards", c.i, label),
                            f"duplicate {label} {v!r}: driver.cards.{seen[v]} has it too", v))
            elif isinstance(v, str):
                seen[v] = c.i

    raw_cards = _as_dict(top.get("cards", {})) or {}
    engines = _as_dict(top.get("engines", {})) or {}
    all_known = kind == "sim" and all(c.known() for c in sims)
    declared = ", ".join(f"{c.name} ({c.pci})" for c in sims if c.known())

    # [cards.X]: which simulated card each names; its values against that card's total.
    for key, rcc in raw_cards.items():
        rcc = _as_dict(rcc)
        if rcc is None:
            continue
        owner = next((c for c in sims if c.known() and _matches(key, c.pci, c.name)), None)
        if kind == "sim" and owner is None and all_known:
            out.append((("cards", key), f"no simulated card is named {key!r} or has that PCI "
                                        f"address (declared: {declared})", key))
        if owner is None:
            continue
        if owner.key is not None:
            out.append((("cards", key), f"card {owner.name} ({owner.pci}) is already configured "
                                        f"by [cards.{_key_str(owner.key)}]; this entry is "
                                        f"ignored: merge them", key))
            continue
        claims = _as_dict(rcc.get("claims", {})) or {}
        owner.key, owner.reserve, owner.baseline, owner.shown = (
            key, _field(CardConfig, rcc, "reserve"), _field(CardConfig, rcc, "baseline"),
            _field(CardConfig, rcc, "name"))
        owner.claims = {k: _claim(v) for k, v in claims.items()}
    if kind == "sim":
        for c in sims:
            out += _card_problems(c)

    # Engines: need within size; on simulated cards, a card that exists and a size that fits.
    by_key: dict[str, _Card] = {}
    for c in sims:
        if c.known():
            by_key[c.pci] = c
            by_key[c.shown if isinstance(c.shown, str) else c.name] = c
    for name, re_ in engines.items():
        re_ = _as_dict(re_)
        if re_ is None:
            continue
        size, need, card = (_field(EngineConfig, re_, "size"), _field(EngineConfig, re_, "need"),
                            _field(EngineConfig, re_, "card"))
        if isinstance(size, int) and isinstance(need, int) and need > size:
            out.append((("engines", name, "need"),
                        f"need {re_['need']!r} is more than the engine's size {re_['size']!r}: "
                        f"the need is what it uses of its size", re_["need"]))
        if not all_known or card is _BAD:
            continue
        target = None
        if card is not None:
            target = by_key.get(card)
            if target is None:
                renamed = next((c for c in sims if c.name == card and isinstance(c.shown, str)),
                               None)
                hint = (f"; [cards.{_key_str(renamed.key)}] shows it as {renamed.shown!r}: "
                        f"use that name or its PCI address" if renamed else "")
                out.append((("engines", name, "card"),
                            f"no simulated card is named {re_['card']!r} or has that PCI "
                            f"address (declared: {declared}){hint}", re_["card"]))
                continue
        if size is _BAD:
            continue
        if size is None:
            if target is not None and isinstance(need, int):
                cap = target.capacity()
                if cap is not None and cap > 0 and need > cap:
                    out.append((("engines", name, "need"),
                                f"need {re_['need']!r} is more than {target.name} can ever grant: "
                                f"{target.sums()} = {format_size(cap)}", re_["need"]))
            continue
        if target is not None:
            cap = target.capacity()
            if cap is not None and cap > 0 and size > cap:
                out.append((("engines", name, "size"),
                            f"size {re_['size']!r} is more than {target.name} can ever grant: "
                            f"{target.sums()} = {format_size(cap)}", re_["size"]))
        elif sims:
            caps = [(c.capacity(), c) for c in sims]
            if all(cap is not None for cap, _ in caps):
                best, c = max(caps, key=lambda x: x[0])
                if best > 0 and size > best:
                    out.append((("engines", name, "size"),
                                f"size {re_['size']!r} is more than any simulated card can ever "
                                f"grant (the most is {c.name}: {c.sums()} = "
                                f"{format_size(best)})", re_["size"]))
    return out


def _card_problems(c: _Card) -> list[tuple[tuple, str, Any]]:
    """One simulated card's reserve, claims and baseline against its total."""
    if not isinstance(c.total, int):
        return []
    out = []
    total = format_size(c.total)
    label = c.name if isinstance(c.name, str) else f"driver.cards.{c.i}"
    if isinstance(c.reserve, int) and c.reserve >= c.total:
        what = "reserve" if c.key is not None else "the default reserve (no [cards.X] entry)"
        out.append((c.where("reserve") if c.key is not None else ("driver", "cards", c.i, "total"),
                    f"{what} {format_size(c.reserve)} is the whole card or more: {label} has "
                    f"{total} total, and the reserve is never granted", c.reserve))
    for k, v in c.claims.items():
        if isinstance(v, int) and v >= c.total:
            out.append((c.where("claims", k), f"claim {k!r} of {format_size(v)} is the whole card "
                                              f"or more: {label} has {total} total", v))
    if isinstance(c.baseline, int) and c.baseline >= c.total:
        out.append((c.where("baseline"), f"baseline {format_size(c.baseline)} is the whole card "
                                         f"or more: {label} has {total} total", c.baseline))
    if isinstance(c.sim_baseline, int) and c.sim_baseline >= c.total:
        out.append((("driver", "cards", c.i, "baseline"),
                    f"baseline {format_size(c.sim_baseline)} is the whole card or more: {label} "
                    f"has {total} total", c.sim_baseline))
    cap = c.capacity()
    if not out and cap is not None and cap <= 0:
        out.append((c.where(), f"no memory would be left to grant on {label}: {c.sums()} = "
                               f"{format_size(cap)}", None))
    return out


# -- errors, in words ------------------------------------------------------------------------
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key_str(k: Any) -> str:
    return str(k) if not isinstance(k, str) or _BARE.match(k) else json.dumps(k)


def _loc_str(loc: tuple) -> str:
    return ".".join(_key_str(x) for x in loc)


def _unwrap(t: Any) -> Any:
    while True:
        origin = typing.get_origin(t)
        if origin is Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return t
            t = args[0]
        else:
            return t


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The model of the table at ``path`` (``("engines", "x")`` -> :class:`EngineConfig`)."""
    t: Any = Config
    for part in path:
        if isinstance(t, type) and issubclass(t, BaseModel):
            f = t.model_fields.get(part) if isinstance(part, str) else None
            if f is None:
                return None
            t = _unwrap(f.annotation)
        elif typing.get_origin(t) in (dict, list):
            t = _unwrap(typing.get_args(t)[-1])
        else:
            return None
    return t if isinstance(t, type) and issubclass(t, BaseModel) else None


def _unknown_key(loc: tuple, value: Any) -> tuple[tuple, str]:
    """An "extra inputs" error, in words: which keys the table allows, or, for a name TOML split
    at its dots (``[engines.qwen2.5-coder]``), how to quote it."""
    *parent, key = loc
    parent = tuple(parent)
    model = _model_at(parent)
    if (len(parent) == 2 and parent[0] in ("engines", "cards") and isinstance(value, dict)
            and model is not None):
        parts, v = [str(parent[1]), str(key)], value
        while isinstance(v, dict) and len(v) == 1:
            (k, sub), = v.items()
            if k in model.model_fields or not isinstance(sub, dict):
                break
            parts.append(k)
            v = sub
        name = ".".join(parts)
        return ((parent[0], name),
                f"TOML reads the dots in [{parent[0]}.{name}] as nested tables ({parent[0]} entry "
                f"{parent[1]!r} holding a table {key!r}): quote the name in the table header, "
                f"e.g. [{parent[0]}.{json.dumps(name)}]")
    msg = "unknown key"
    if model is not None:
        allowed = list(model.model_fields)
        close = difflib.get_close_matches(str(key), allowed, 1)
        if close:
            msg += f" (did you mean {close[0]!r}?)"
        where = f"[{_loc_str(parent)}]" if parent else "the top level"
        msg += f"; {where} allows: {', '.join(allowed)}"
    if not isinstance(value, dict):
        msg += f" (got {value!r})"
    return loc, msg


class ConfigError(ValueError):
    """A config that cannot be used. ``problems`` lists ``(key path, message)`` pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {k}: {m}" for k, m in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


def parse(data: dict, source: str = "berth.toml") -> Config:
    """Validate a parsed TOML document. Raises :class:`ConfigError` listing every problem."""
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        order = list(Config.model_fields)
        problems = []
        for err in e.errors():
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and (
                x.startswith("function-") or x.startswith("Annotated["))))
            msg = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            if err["type"] == "extra_forbidden":
                loc, msg = _unknown_key(loc, value)
            elif err["type"] not in ("value_error", _CROSS) and not isinstance(value, dict):
                msg += f" (got {value!r})"
            rank = (order.index(loc[0]) if loc and loc[0] in order else len(order), 0)
            if len(loc) > 1 and loc[0] in ("engines", "cards") and isinstance(
                    data.get(loc[0]), dict) and loc[1] in data[loc[0]]:
                rank = (rank[0], list(data[loc[0]]).index(loc[1]))   # an entry's problems together
            problems.append((rank, _loc_str(loc) or "(top)", msg))
        problems.sort(key=lambda p: p[0])
        raise ConfigError(source, [(k, m) for _, k, m in problems]) from None


def load(path: str | Path) -> Config:
    """Read and validate ``path``. Raises :class:`ConfigError` (also for a missing file or
    malformed TOML, naming the line)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(p), [("(file)", "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError(str(p), [("(file)", "is a directory; give the path of berth.toml "
                                               "itself")]) from None
    except PermissionError:
        raise ConfigError(str(p), [("(file)", "cannot be read (permission denied)")]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), [("(file)", f"not UTF-8 text (TOML must be UTF-8): byte "
                                               f"{e.object[e.start]:#04x} at offset {e.start}")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(p), [("(toml)", str(e))]) from None
    return parse(data, str(p))


def load_config(path: str | Path | None) -> tuple[Config, Path | None]:
    """The config at ``path``, else ``$BERTH_CONFIG``, else the default location
    (:func:`berth.paths.config_path`); with no file at the default location, the defaults
    (NVML). Returns the config and the file it came from (``None``: defaults). Raises
    :class:`ConfigError`."""
    from berth import paths
    if path:
        return load(path), Path(path)
    p = paths.config_path()
    if p.exists():
        return load(p), p
    if os.environ.get("BERTH_CONFIG"):
        return load(p), p          # named but missing: say so
    return Config(), None


def plugin_problems(cfg: Config, known: set[str]) -> list[tuple[str, str]]:
    """Engine entries naming a mechanism no plugin carries out: ``(key path, message)`` pairs.

    ``known`` is every mechanism the registered plugins carry out (built-ins and entry points:
    :func:`berth_plugins.manager.mechanisms`). An entry needs its ``adapter`` for ``park =
    'hook'`` and for ``lend`` (``protocol`` when none is named), and ``supervisor`` for a
    ``supervisor`` program (hookspecs ``berth_mechanisms``)."""
    names = ", ".join(sorted(known)) or "none"
    out = []
    for name, e in cfg.engines.items():
        if e.adapter and e.adapter not in known:
            close = difflib.get_close_matches(e.adapter, sorted(known), 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append((f"engines.{_key_str(name)}.adapter",
                        f"no plugin carries out adapter {e.adapter!r}{hint}; known adapters: "
                        f"{names}"))
        elif not e.adapter and e.lend and "protocol" not in known:
            out.append((f"engines.{_key_str(name)}.lend",
                        f"lend without an adapter uses 'protocol', which no plugin carries out; "
                        f"known adapters: {names}"))
        if e.park and e.park != "hook" and e.park not in known:
            out.append((f"engines.{_key_str(name)}.park",
                        f"no plugin carries out park {e.park!r}; known mechanisms: {names}"))
        if e.supervisor and "supervisor" not in known:
            out.append((f"engines.{_key_str(name)}.supervisor",
                        f"no plugin carries out 'supervisor' (is berth_hosts' entry point "
                        f"installed?); known mechanisms: {names}"))
    return out


def _card_words(cc: CardConfig, declared_baseline: int | None) -> str:
    """A card's reserve, claims and baseline, in words."""
    s = f"reserve {format_size(cc.reserve)}"
    if cc.claims:
        s += f", claims {', '.join(f'{k}={format_size(v)}' for k, v in cc.claims.items())}"
    if cc.baseline is not None:
        s += f", baseline {format_size(cc.baseline)} (configured)"
    elif declared_baseline is not None:
        s += (f", baseline measured when berthd starts (the simulated card's own "
              f"{format_size(declared_baseline)})")
    else:
        s += ", baseline measured when berthd starts"
    if cc.name:
        s += f", shown as {cc.name}"
    return s


def summary(cfg: Config) -> str:
    """What a config means, in words: cards, reserves, engines, policy."""
    out = [f"driver: {cfg.driver.kind}"]
    for c in cfg.driver.cards:
        cc = cfg.card_config(c.pci, c.name)
        base = cc.baseline if cc.baseline is not None else c.baseline
        grant = c.total - cc.reserve - base - sum(cc.claims.values())
        out.append(f"  card {c.name} ({c.pci}): {format_size(c.total)} total, "
                   f"{_card_words(cc, c.baseline)}; at most {format_size(grant)} to grant")
    if cfg.driver.kind == "nvml":
        for key, cc in cfg.cards.items():
            out.append(f"  card {key}: {_card_words(cc, None)}")
        out.append(f"  other cards: reserve {format_size(CardConfig().reserve)} (default), "
                   f"baseline measured when berthd starts")
    p = cfg.policy
    out.append(f"policy: queue {p.queue}, release_grace {format_duration(p.release_grace)}, "
               f"wake_limit {format_duration(p.wake_limit)}, wait_limit "
               f"{format_duration(p.wait_limit)}, min_turn {format_duration(p.min_turn)}, "
               f"juggle {p.juggle_max_swaps} swaps / {format_duration(p.juggle_window)}, "
               f"read_interval {format_duration(p.read_interval)}")
    out.append("ram budget for parks: " + (
        "auto (80% of the host RAM available when berthd starts)" if p.ram_budget == "auto"
        else format_size(p.ram_budget)))
    for name, e in cfg.engines.items():
        caps = ", ".join(x for x in (f"park={e.park}/{e.adapter}" if e.park else "",
                                     "lend" if e.lend else "",
                                     f"front={e.front}" if e.front else "") if x) or "no park"
        where = f"supervisor program {e.supervisor} ({e.mode})" if e.supervisor else (e.url or "")
        out.append(f"engine {name}: size {format_size(e.size)}"
                   + (f" on {e.card}" if e.card else "")
                   + f", bound {e.bound}, priority {e.priority}; {caps}"
                   + (f"; {where}" if where else ""))
    return "\n".join(out)
