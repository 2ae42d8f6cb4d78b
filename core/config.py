"""``berth.toml``: the schema (pydantic), and errors that name every bad key and value.

Source: DESIGN.md "Config"; issue 4. Sizes are strings with binary units (``"24GiB"``) or the
word ``card``; durations are strings like ``"20s"``. Inside, every size is bytes and every
duration seconds. :func:`load` raises :class:`ConfigError` listing *every* problem by its key
path, e.g. ``cards.gpu0.reserve: expected a size like '24GiB', got 'lots'``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      field_validator, model_validator)

from .admission import Policy, QueuePolicy
from .model import Bound, normalize_pci
from .units import format_duration, format_size, parse_duration, parse_size

__all__ = ["Config", "ConfigError", "load", "parse", "summary", "EngineConfig", "DriverConfig"]


def _size(v: Any) -> int:
    return parse_size(v, field="size")


def _size_or_card(v: Any) -> int | None:
    return parse_size(v, field="size", allow_card=True)


def _dur(v: Any) -> float:
    return parse_duration(v, field="duration")


Size = Annotated[int, BeforeValidator(_size)]
SizeOrCard = Annotated[int | None, BeforeValidator(_size_or_card)]
Duration = Annotated[float, BeforeValidator(_dur)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimCard(_Strict):
    """A simulated card (``[[driver.cards]]``, sim only)."""

    pci: str
    name: str
    total: Size
    baseline: Size = 0

    @field_validator("pci")
    @classmethod
    def _pci(cls, v: str) -> str:
        return normalize_pci(v)


class DriverConfig(_Strict):
    """``[driver]``: ``kind`` is ``nvml`` (real cards) or ``sim`` (simulated cards declared in
    ``cards``, shared across processes under ``sim_dir``, default ``$BERTH_SIM_DIR`` or
    ``<state dir>/sim``). ``free_delay`` is how long a simulated card takes to free a dead
    process's memory; ``checkpoint_rate`` the stand-in cuda-checkpoint's bytes per second."""

    kind: Literal["nvml", "sim"] = "nvml"
    cards: list[SimCard] = Field(default_factory=list)
    sim_dir: str | None = None
    free_delay: Duration = 0.5
    checkpoint_rate: Size = 7_000_000_000
    proc_root: str = "/proc"

    @model_validator(mode="after")
    def _sim_needs_cards(self):
        if self.kind == "sim" and not self.cards:
            raise ValueError("driver.kind = 'sim' needs at least one [[driver.cards]] entry "
                             "(pci, name, total)")
        if self.kind == "nvml" and self.cards:
            raise ValueError("[[driver.cards]] declares simulated cards; set driver.kind = 'sim'")
        names = [c.name for c in self.cards]
        pcis = [c.pci for c in self.cards]
        for label, seq in (("name", names), ("pci", pcis)):
            dup = {x for x in seq if seq.count(x) > 1}
            if dup:
                raise ValueError(f"driver.cards: duplicate {label} {sorted(dup)}")
        return self


class CardConfig(_Strict):
    """``[cards.<name or PCI>]``: ``reserve`` (the floor, never granted), ``claims`` (bytes
    held for users outside Berth), ``baseline`` (overrides the measured baseline), ``name``
    (a short name to show)."""

    reserve: Size = 512 << 20
    claims: dict[str, Size] = Field(default_factory=dict)
    baseline: Size | None = None
    name: str | None = None


class PolicyConfig(_Strict):
    """``[policy]``: see :class:`berth.admission.Policy` for each knob."""

    queue: QueuePolicy = QueuePolicy.SCAN
    scan_max_skips: int = Field(8, ge=0)
    scan_max_wait: Duration = 30.0
    release_grace: Duration = 20.0
    wake_limit: Duration = 60.0
    wait_limit: Duration = 120.0
    ram_budget: SizeOrCard | Literal["auto"] = "auto"
    min_turn: Duration = 10.0
    juggle_window: Duration = 120.0
    juggle_max_swaps: int = Field(4, ge=0)
    read_interval: Duration = 1.0
    hook_residual_guess: Size = 2 << 30

    @field_validator("ram_budget", mode="before")
    @classmethod
    def _ram(cls, v):
        return "auto" if v == "auto" else parse_size(v, field="ram_budget")

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
    """

    url: str | None = None
    front: str | None = None
    park: Literal["hook", "checkpoint"] | None = None
    lend: bool = False
    lend_max: Size | None = None
    adapter: str | None = None
    bound: Bound = Bound.DECLARED
    size: SizeOrCard = None
    card: str | None = None
    need: Size | None = None
    growth_allowance: Size = 0
    priority: int = 0
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
    and an optional TCP listener, which requires a key."""

    socket: str | None = None
    tcp: str | None = None
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


class Config(_Strict):
    """The whole of ``berth.toml``."""

    driver: DriverConfig = Field(default_factory=DriverConfig)
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    api: ApiConfig = Field(default_factory=ApiConfig)
    hosts: HostsConfig = Field(default_factory=HostsConfig)
    state_dir: str | None = None

    @model_validator(mode="after")
    def _cards_known(self):
        if self.driver.kind == "sim":
            known = {c.name for c in self.driver.cards} | {c.pci for c in self.driver.cards}
            for key in self.cards:
                k = key
                try:
                    k = normalize_pci(key)
                except ValueError:
                    pass
                if k not in known:
                    raise ValueError(f"cards.{key}: no simulated card is named {key!r} "
                                     f"(declared: {sorted(c.name for c in self.driver.cards)})")
        return self

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
        problems = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-"))
            loc = loc.replace(".Annotated[int, BeforeValidator]", "")
            msg = err["msg"].removeprefix("Value error, ")
            if "input" in err and err["type"] not in ("value_error",) and not isinstance(
                    err["input"], dict):
                msg += f" (got {err['input']!r})"
            problems.append((loc or "(top)", msg))
        raise ConfigError(source, problems) from None


def load(path: str | Path) -> Config:
    """Read and validate ``path``. Raises :class:`ConfigError` (also for a missing file or
    malformed TOML, naming the line)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(str(p), [("(file)", "no such file")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(p), [("(toml)", str(e))]) from None
    return parse(data, str(p))


def summary(cfg: Config) -> str:
    """What a config means, in words: cards, reserves, engines, policy."""
    out = [f"driver: {cfg.driver.kind}"]
    for c in cfg.driver.cards:
        cc = cfg.card_config(c.pci, c.name)
        out.append(f"  card {c.name} ({c.pci}): {format_size(c.total)} total, baseline "
                   f"{format_size(c.baseline)}, reserve {format_size(cc.reserve)}"
                   + (f", claims {', '.join(f'{k}={format_size(v)}' for k, v in cc.claims.items())}"
                      if cc.claims else ""))
    if cfg.driver.kind == "nvml":
        for key, cc in cfg.cards.items():
            out.append(f"  card {key}: reserve {format_size(cc.reserve)}")
        out.append(f"  other cards: reserve {format_size(CardConfig().reserve)} (default)")
    p = cfg.policy
    out.append(f"policy: queue {p.queue}, release_grace {format_duration(p.release_grace)}, "
               f"wake_limit {format_duration(p.wake_limit)}, wait_limit "
               f"{format_duration(p.wait_limit)}, min_turn {format_duration(p.min_turn)}, "
               f"juggle {p.juggle_max_swaps} swaps / {format_duration(p.juggle_window)}, "
               f"ram_budget {p.ram_budget if p.ram_budget == 'auto' else format_size(p.ram_budget)}")
    for name, e in cfg.engines.items():
        caps = ", ".join(x for x in (f"park={e.park}/{e.adapter}" if e.park else "",
                                     "lend" if e.lend else "",
                                     f"front={e.front}" if e.front else "") if x) or "no park"
        where = f"supervisor program {e.supervisor} ({e.mode})" if e.supervisor else (e.url or "")
        out.append(f"engine {name}: size {format_size(e.size)}, bound {e.bound}, priority "
                   f"{e.priority}; {caps}" + (f"; {where}" if where else ""))
    return "\n".join(out)
