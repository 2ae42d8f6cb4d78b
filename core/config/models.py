"""berth.toml's schema: one pydantic model per table, with the rules inside one table.

Source: DESIGN.md "Config"; issue 4; seed 002 "Capabilities". The checks between tables (a
card's reserve against its total, an engine's size against its card) are :mod:`.cross`'s,
run by :class:`Config`'s after-validator on the typed models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

# The model's kinds, not the model: `berth status` and the other commands that only read
# berth.toml build none of the decision model's dataclasses (.policy() loads admission).
from berth.decide.kinds import DEFAULT_KEEP_WARM_S, Bound, QueuePolicy, names_card
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from . import cross
from .values import (
    DEFAULT_RESERVE_BYTES,
    CardBytes,
    CardKey,
    Duration,
    EngineSize,
    Listen,
    OptCardBytes,
    OptPriority,
    Pci,
    PositiveDuration,
    Priority,
    RamBudget,
    Rate,
    ReadInterval,
    Size,
    SocketMode,
    TcpAddress,
    Total,
    Whole,
)

if TYPE_CHECKING:
    from berth.decide.admission import Policy

#: The error type of a problem between values (its message needs no "(got ...)").
CROSS = "berth_config"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimCard(_Strict):
    """A simulated card (``[[driver.cards]]``, sim only). ``pci`` defaults to
    ``0000:<n>:00.0`` for the n-th card (from 1), as ``berth sim init`` picks it."""

    pci: Pci
    name: str
    total: Total
    baseline: CardBytes = 0
    # The chip's kind: a checkpoint restores onto another card only of the same kind (issue 35).
    model: str | None = Field(None, min_length=1, max_length=100)

    @model_validator(mode="before")
    @classmethod
    def _stand_ins(cls, data: Any, info: ValidationInfo) -> Any:
        # The second validation of berth.config.loading.parse leaves refused values out; a
        # required one gets a stand-in that the cross-checks never read (its key is unknown).
        if isinstance(data, dict) and cross.UNKNOWN in (info.context or {}):
            data = {"name": "", "total": "1B", **data}
        return data


class DriverConfig(_Strict):
    """``[driver]``: ``kind`` is ``nvml`` (real cards) or ``sim`` (simulated cards declared in
    ``cards``, shared across processes under ``sim_dir``, default ``$BERTH_SIM_DIR`` or
    ``<state dir>/sim``). ``free_delay`` is how long a simulated card takes to free a dead
    process's memory; ``checkpoint_rate`` the stand-in cuda-checkpoint's bytes per second;
    ``host_ram`` the simulated host's available RAM, which ``ram_budget = "auto"`` takes 80 % of
    instead of this machine's (so a simulation can be a 24 GiB host on a larger one).
    (Which cards are declared, and whether they fit ``kind``, is checked in :mod:`.cross`.)"""

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
    #: sim only: false drops a process that exited from the card's process list at once,
    #: while its memory frees ``free_delay`` later (real drivers do; issue 24)
    list_exited: StrictBool = True
    checkpoint_rate: Rate = 7_000_000_000
    proc_root: str = "/proc"
    host_ram: Size | None = None

    @model_validator(mode="after")
    def _host_ram_is_simulated(self):
        if self.host_ram is not None and self.kind != "sim":
            raise ValueError("host_ram: only simulated cards (kind = \"sim\") have a simulated "
                             "host; on real cards ram_budget = \"auto\" reads this machine's RAM")
        return self


class CardConfig(_Strict):
    """``[cards.<name or PCI>]``: ``reserve`` (the floor, never granted), ``claims`` (bytes
    held for users outside Berth), ``baseline`` (overrides the measured baseline), ``name``
    (a short name to show)."""

    reserve: CardBytes = DEFAULT_RESERVE_BYTES
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
    max_job: PositiveDuration = 3600.0
    max_turn: Duration = 60.0
    first_request: Duration = 1.5
    demand_trust: float = Field(0.0, ge=0.0, le=1.0)

    def policy(self) -> Policy:
        from berth.decide.admission import Policy
        return Policy(queue=self.queue, scan_max_skips=self.scan_max_skips,
                      scan_max_wait_s=self.scan_max_wait, release_grace_s=self.release_grace,
                      wake_limit_s=self.wake_limit, wait_limit_s=self.wait_limit,
                      min_turn_s=self.min_turn, juggle_window_s=self.juggle_window,
                      juggle_max_swaps=self.juggle_max_swaps,
                      hook_residual_guess_bytes=self.hook_residual_guess,
                      read_interval_s=self.read_interval, max_job_s=self.max_job,
                      max_turn_s=self.max_turn, first_request_s=self.first_request,
                      demand_trust=self.demand_trust)


class EngineConfig(_Strict):
    """``[engines.<name>]``: an engine entry (DESIGN.md "Config", seed 002 "Capabilities").

    ``park = "checkpoint"`` is refused here: checkpoint needs a run's own front, so it goes on a
    ``berth run --front`` line (seed 002). ``park``/``lend`` need a ``front`` (rule 3).
    ``lend_max`` needs ``lend = true`` (checked across values, :mod:`berth.config.cross`, to be
    named at its own key).
    ``supervisor`` names a supervisord program (issue 7), with ``mode`` observe or gate.
    ``card`` is a card's short name or PCI address (kept normalised, as berthd keys cards).
    ``max_job`` bounds how long the ladder waits for this engine's requests in flight before it
    displaces it anyway (default: ``[policy] max_job``, an hour); ``preempt = true`` lets this
    engine, when of higher priority, displace a holder without waiting for its requests in
    flight (issue 12 case 4).
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
    priority: Priority = 0
    #: The highest priority a client that is not an operator may ask for this engine
    #: (issue 18); ``None``: the entry's own ``priority``.
    max_priority: OptPriority = None
    # How long after its last request the priority still protects the idle engine (issue 16).
    keep_warm: Duration = DEFAULT_KEEP_WARM_S
    max_job: PositiveDuration | None = None
    preempt: StrictBool = False
    supervisor: str | None = None
    mode: Literal["observe", "gate"] = "observe"
    options: dict[str, Any] = Field(default_factory=dict)
    #: How many requests the engine runs at once: a ``berth run`` front forwards that many and
    #: holds the rest (issue 34). ``None``: the run measures them (:mod:`berth.run.slots`).
    slots: Annotated[Whole, Field(ge=1)] | None = None
    #: The gateway ends an answer from this engine that sends no byte for this long once its
    #: headers came (issue 27: every relay is bounded); longer than any normal gap of the engine.
    read_timeout: PositiveDuration = 30.0
    #: Who may lease this engine's name (issue 26: names are owned): these Unix user names and
    #: the members of ``group``. Neither given: the operators (``[api] operator_group``). Root
    #: and berthd's own user always may.
    users: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list)
    group: str | None = Field(None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo):
        if cross.rules_off(info.context):
            return self
        if self.park == "checkpoint":
            raise ValueError("park = 'checkpoint' is refused on an engine entry: every run of the "
                             "entry would share one front. Put it on a `berth run --front ADDR "
                             "--park checkpoint` line")
        if (self.park or self.lend) and not self.front:
            raise ValueError("park and lend need a front (rule 3: Berth parks an engine only when "
                             "every request passes through a Berth front); set front = ...")
        if self.park == "hook" and not self.adapter:
            from berth_plugins.adapters import names  # the registry, read only on this error
            raise ValueError(f"park = 'hook' needs an adapter (installed: "
                             f"{', '.join(names()) or 'none'})")
        return self


class ApiConfig(_Strict):
    """``[api]``: the control socket (default ``$BERTH_SOCKET`` or ``<state dir>/berthd.sock``)
    and an optional TCP listener (``HOST:PORT``), which requires a key."""

    socket: str | None = None
    #: The socket's group and mode: members of ``socket_group`` may connect (lease, report,
    #: read the status) when the mode lets the group read and write; berthd refuses to start
    #: when the group does not exist (issue 29). Operators are ``operator_group``'s.
    socket_group: str | None = Field(None, min_length=1, max_length=64)
    socket_mode: SocketMode = 0o660
    tcp: TcpAddress = None
    #: The TCP API's key: at least 16 characters, as the board's and the network's (issue 36).
    key: str | None = Field(None, min_length=16)
    #: Members of this Unix group are operators (park, wake, drain, hold; any priority), as are
    #: root and the socket's owner (issue 18).
    operator_group: str | None = None
    #: Per Unix user name, the highest priority that user's clients may ask (default 0).
    max_priority: dict[str, Priority] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _tcp_key(self, info: ValidationInfo):
        if cross.rules_off(info.context):
            return self
        if self.tcp and not self.key:
            raise ValueError("api.tcp needs api.key: the TCP control API is never open without one")
        if self.socket_group and self.socket_mode & 0o060 != 0o060:
            raise ValueError(f"api.socket_mode {oct(self.socket_mode)} does not let "
                             f"api.socket_group {self.socket_group!r} read and write the socket, "
                             f"so its members could not connect; use 0o660")
        return self


class BoardConfig(_Strict):
    """``[board]``: the web board (issue 15). ``listen``: where berthd serves it over HTTP
    (default ``127.0.0.1:7088``, loopback only; ``"off"`` for none; a port already taken is
    logged and berthd runs on without the board). The board is read-only; ``key`` (at least 16
    characters) lets an operator who gives it park, wake, drain and hold from the page."""

    listen: Listen = "127.0.0.1:7088"
    key: str | None = Field(None, min_length=16)
    #: How long an operator's sign-in lasts (issue 26: sessions expire).
    session_limit: PositiveDuration = 8 * 3600.0


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
    def _peers_key(self, info: ValidationInfo):
        if cross.rules_off(info.context):
            return self
        if self.peers and not self.key:
            raise ValueError("network.peers needs network.key: peer calls are always signed")
        return self


def _origin(v: Any) -> str:
    """An allowed browser origin: ``https://comfy.example`` (scheme, host, an optional port)."""
    from berth.origin import parse_origin
    if not isinstance(v, str) or parse_origin(v) is None:
        raise ValueError(f"expected an origin like 'https://comfy.example' or "
                         f"'http://studio.lan:8188' (scheme, host, port; no path), got {v!r}")
    return v.strip().rstrip("/")


class ListenersConfig(_Strict):
    """``[listeners]``: what the gateway's listeners allow a client (issue 26): a request head
    within ``head_timeout``, a kept-alive connection idle (or a request body silent) at most
    ``idle_timeout``, at most ``max_connections`` open (0: from the file descriptor limit);
    ``origins``: browser pages allowed besides this machine's own (:mod:`berth.origin`)."""

    head_timeout: PositiveDuration = 10.0
    idle_timeout: PositiveDuration = 60.0
    max_connections: Whole = 0
    #: Browser pages, besides this machine's own (loopback, the listener's address), that may
    #: call the gateway and ComfyUI's port: ``scheme://host[:port]`` each (issue 36).
    origins: list[Annotated[str, BeforeValidator(_origin)]] = Field(default_factory=list,
                                                                     max_length=64)


class Config(_Strict):
    """The whole of ``berth.toml``."""

    driver: DriverConfig = Field(default_factory=DriverConfig)
    board: BoardConfig = Field(default_factory=BoardConfig)
    cards: dict[str, CardConfig] = Field(default_factory=dict)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    api: ApiConfig = Field(default_factory=ApiConfig)
    hosts: HostsConfig = Field(default_factory=HostsConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    listeners: ListenersConfig = Field(default_factory=ListenersConfig)
    state_dir: str | None = None

    @model_validator(mode="after")
    def _together(self, info: ValidationInfo):
        """Values against each other (:mod:`.cross`), every problem at once, each at its key
        path. The context's ``UNKNOWN`` key paths (values refused on their own, see
        :func:`berth.config.loading.parse`) are not read."""
        ctx = info.context or {}
        found = cross.problems(self, frozenset(ctx.get(cross.UNKNOWN, ())), ctx.get(cross.RAW))
        if found:
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError(CROSS, msg), loc=loc, input=value)
                for loc, msg, value in found])
        return self

    def card_config(self, pci: str, name: str) -> CardConfig:
        """The ``[cards.X]`` entry for a card, by PCI address or name (default if none)."""
        return next((cc for key, cc in self.cards.items() if names_card(key, pci, name)),
                    CardConfig())


