"""Workload files: the cards, the engines, what each mechanism costs, and a request trace.

A workload is one JSON file under ``bench/policy/workloads/`` written by :mod:`.gen` from a seed
and committed, so every run replays the same trace. Units: bytes are ``int`` (``_bytes``),
durations ``float`` seconds (``_s``), rates decimal GB/s (``_gbps``, 1e9 bytes per second).

Mechanism costs (:class:`Mechanisms`) and where their defaults come from:

- ``restore_gbps`` 7.0: seed 002, "NInfer's 23.1 GB comes back in 3.3 s" (cuda-checkpoint restore).
- ``checkpoint_gbps`` 7.0: the seed gives no figure for the way out; we assume the same copy rate.
- ``reload_gbps`` 1.925 and ``init_s`` 2.0: a reload of 23.1 GB takes 2 + 23.1/1.925 = 14 s,
  seed 002's "where a reload takes 14 s".
- ``drain_s`` 1.0 (SIGTERM to exit) and ``free_lag_s`` 1.0 (exit to the driver showing the memory
  free): reference/peers.md, Ollama "typical convergence is 0.5-1.5 s".
- ``health_first_s``/``health_every_s`` 0.25/1.0: llama-swap's readiness poll
  (reference/llama-swap.md "Readiness and states").
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

__all__ = ["CardSpec", "EngineSpec", "RequestSpec", "ClientSpec", "Mechanisms", "Workload", "GiB",
           "MiB"]

GiB = 1 << 30
#: The fields every client entry in a file carries (the rest only when set).
_CLIENT_CORE = ("engine", "start_s", "until_s", "pause_s", "service_s", "growth_bytes",
                "ramp_s", "kind")
MiB = 1 << 20


@dataclass(frozen=True)
class CardSpec:
    """One card. ``reserve_bytes`` is Berth's floor on it (seed 000 "The watermark"); the peers
    have none of their own."""

    pci: str
    name: str
    total_bytes: int
    reserve_bytes: int = 0


@dataclass(frozen=True)
class EngineSpec:
    """One engine, placed on fixed cards (every policy uses the same placement).

    Per card (keys are PCI addresses): ``size_bytes`` is the declared maximum (the engine never
    grows past it: it queues requests internally instead, as a KV pool does); ``base_bytes``
    what a load allocates (weights and context). ``slots`` requests run at once. A request's
    growth is spread over the cards in proportion to ``size − base``. ``retain_growth``: the
    engine keeps its high-water mark after a request ends (PyTorch's caching allocator, as
    ComfyUI does) until it is parked or stopped. ``park``: ``"checkpoint"``, ``"hook"`` or
    ``None`` (drain only). ``growth_allowance_bytes``: seed 000's allowance A, per card, used
    by Berth's ``growth`` bound. ``keep_alive_s``: Ollama's keep_alive for ``keepalive-evict``.
    ``keep_warm_s``: Berth's per-engine ``keep_warm`` (how long a priority protects an idle
    holder after its last request; ``None``: Berth's default). ``drain``: ``False`` for an
    in-process host that nobody can stop (ComfyUI with its node: ``--highvram`` gives it no park
    either); a stop of it does nothing, and Berth leases it without the drain (issue 24).
    ``free``: a policy that places (issue 25) may load it on any cards, as many as its own
    (:meth:`on`); its own cards are where a policy that does not place loads it.
    """

    name: str
    size_bytes: dict[str, int]
    base_bytes: dict[str, int]
    slots: int = 1
    retain_growth: bool = False
    park: str | None = "checkpoint"
    lend: bool = False
    priority: int = 0
    growth_allowance_bytes: int = 0
    keep_alive_s: float = 300.0
    keep_warm_s: float | None = None
    drain: bool = True
    note: str = ""
    free: bool = False

    @property
    def cards(self) -> tuple[str, ...]:
        return tuple(self.size_bytes)

    def on(self, cards: tuple[str, ...]) -> "EngineSpec":
        """The same engine placed on ``cards`` (PCI addresses, one for each of its own, in
        order). Raises ``ValueError`` for the wrong count or a card named twice."""
        if len(cards) != len(self.cards) or len(set(cards)) != len(cards):
            raise ValueError(f"{self.name}: cards: expected {len(self.cards)} distinct cards, "
                             f"got {cards!r}")
        to = dict(zip(self.cards, cards, strict=True))
        return replace(self, size_bytes={to[p]: b for p, b in self.size_bytes.items()},
                       base_bytes={to[p]: b for p, b in self.base_bytes.items()})

    def growth_split(self, growth_bytes: int) -> dict[str, int]:
        """Spread one request's growth over the cards in proportion to ``size − base``."""
        room = {p: self.size_bytes[p] - self.base_bytes[p] for p in self.cards}
        total = sum(room.values()) or 1
        return {p: growth_bytes * r // total for p, r in room.items()}


@dataclass(frozen=True)
class RequestSpec:
    """One request: it arrives at ``t_s``, runs ``service_s`` once started, and grows its engine
    by ``growth_bytes`` in all (KV cache or activations), reached linearly over ``ramp_s``.
    ``leave_s``: its client gives up (closes the connection) if it has not started by then,
    counted from its arrival (``None``: it waits as long as it takes)."""

    t_s: float
    engine: str
    service_s: float
    growth_bytes: int
    ramp_s: float
    kind: str = "chat"
    leave_s: float | None = None


@dataclass(frozen=True)
class ClientSpec:
    """A closed-loop client: its first request leaves at ``start_s``; after each answer it
    thinks, then sends the next, while the time is before ``until_s`` (issue 24's ping-pong;
    issue 34's client that moves between engines). Unlike :class:`RequestSpec` arrivals, its
    send times depend on the policy; what it sends does not (:meth:`steps`).

    - engine: ``engine`` alone (a fixed engine), or ``engines``: a sequence it cycles through
      (A, B, A, B, ...), or with ``weights`` (one per engine) a random choice for each request.
    - think time: ``pause_s`` seconds, or uniform in ``[pause_s, pause_max_s]``; with
      ``burst`` > 1, that think time follows every ``burst``-th answer and ``burst_gap_s``
      follows the others (a user who sends a few requests back to back, then reads).
    - each request runs ``service_s`` (uniform up to ``service_max_s`` when given) and grows its
      engine by ``growth_bytes`` over ``ramp_s``.
    - ``seed``: the client's own draws, so the n-th request's engine, service and think time
      are the same under every policy.
    """

    engine: str
    start_s: float
    until_s: float
    pause_s: float
    service_s: float
    growth_bytes: int = 0
    ramp_s: float = 0.0
    kind: str = "chat"
    engines: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    pause_max_s: float | None = None
    service_max_s: float | None = None
    seed: int = 0
    burst: int = 1
    burst_gap_s: float = 0.0

    def __post_init__(self):
        # JSON gives lists; the spec stays hashable and comparable.
        object.__setattr__(self, "engines", tuple(self.engines))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))

    @property
    def names(self) -> tuple[str, ...]:
        """Every engine this client may ask for."""
        return self.engines or (self.engine,)

    def request(self, t_s: float, engine: str | None = None,
                service_s: float | None = None) -> RequestSpec:
        return RequestSpec(t_s, engine or self.engine,
                           self.service_s if service_s is None else service_s,
                           self.growth_bytes, self.ramp_s, self.kind)

    def steps(self):
        """Yield ``(engine, service_s, think_s)`` for the client's 1st, 2nd, ... request
        (infinite; deterministic from ``seed``): the think time is what follows that answer."""
        rng = random.Random(self.seed)
        names = self.names
        for n in itertools.count():
            if self.weights:
                engine = rng.choices(names, weights=self.weights)[0]
            else:
                engine = names[n % len(names)]
            service = (self.service_s if self.service_max_s is None
                       else rng.uniform(self.service_s, self.service_max_s))
            think = (self.pause_s if self.pause_max_s is None
                     else rng.uniform(self.pause_s, self.pause_max_s))
            if (n + 1) % self.burst:
                think = self.burst_gap_s
            yield engine, service, think


@dataclass(frozen=True)
class Mechanisms:
    """What each mechanism costs (see the module docstring for the sources)."""

    restore_gbps: float = 7.0
    checkpoint_gbps: float = 7.0
    reload_gbps: float = 23.1 / 12.0
    init_s: float = 2.0
    drain_s: float = 1.0
    free_lag_s: float = 1.0
    chunk_bytes: int = 256 * MiB
    read_interval_s: float = 1.0
    health_first_s: float = 0.25
    health_every_s: float = 1.0
    retry_after_s: float = 1.0
    max_attempts: int = 5

    def load_s(self, n_bytes: int) -> float:
        """A cold load or reload: init plus reading the weights."""
        return self.init_s + n_bytes / (self.reload_gbps * 1e9)

    def restore_s(self, n_bytes: int) -> float:
        return n_bytes / (self.restore_gbps * 1e9)

    def checkpoint_s(self, n_bytes: int) -> float:
        return n_bytes / (self.checkpoint_gbps * 1e9)

    def health_ready_s(self, load_s: float) -> float:
        """When llama-swap's poll first sees an engine ready that finished loading after
        ``load_s``: 0.25 s after spawn, then every second."""
        if load_s <= self.health_first_s:
            return self.health_first_s
        k = math.ceil((load_s - self.health_first_s) / self.health_every_s - 1e-9)
        return self.health_first_s + k * self.health_every_s


@dataclass(frozen=True)
class Workload:
    """A whole workload; :meth:`load` reads one and checks it (``ValueError`` naming the field)."""

    name: str
    description: str
    seed: int
    duration_s: float
    host_ram_bytes: int
    cards: tuple[CardSpec, ...]
    engines: tuple[EngineSpec, ...]
    requests: tuple[RequestSpec, ...]
    mechanisms: Mechanisms = field(default_factory=Mechanisms)
    generator: dict = field(default_factory=dict)
    clients: tuple[ClientSpec, ...] = ()

    def engine(self, name: str) -> EngineSpec:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(f"engine {name!r}: not in workload {self.name}")

    def card(self, pci: str) -> CardSpec:
        for c in self.cards:
            if c.pci == pci:
                return c
        raise KeyError(f"card {pci!r}: not in workload {self.name}")

    def truncated(self, duration_s: float) -> "Workload":
        """The same workload with only the requests that arrive before ``duration_s``."""
        reqs = tuple(r for r in self.requests if r.t_s < duration_s)
        return replace(self, duration_s=duration_s, requests=reqs)

    def validate(self) -> "Workload":
        pcis = {c.pci for c in self.cards}
        if len(pcis) != len(self.cards):
            raise ValueError(f"{self.name}: cards: duplicate PCI address")
        names = set()
        for e in self.engines:
            if e.name in names:
                raise ValueError(f"{self.name}: engines: duplicate name {e.name!r}")
            names.add(e.name)
            if set(e.size_bytes) != set(e.base_bytes) or not e.size_bytes:
                raise ValueError(f"{self.name}: engine {e.name}: size_bytes and base_bytes must "
                                 f"name the same cards")
            for p in e.cards:
                if p not in pcis:
                    raise ValueError(f"{self.name}: engine {e.name}: unknown card {p!r}")
                if not 0 < e.base_bytes[p] <= e.size_bytes[p] <= self.card(p).total_bytes:
                    raise ValueError(f"{self.name}: engine {e.name}: need 0 < base <= size <= "
                                     f"card total on {p}")
            if e.slots < 1:
                raise ValueError(f"{self.name}: engine {e.name}: slots must be >= 1")
        last = -1.0
        for i, r in enumerate(self.requests):
            if r.engine not in names:
                raise ValueError(f"{self.name}: requests[{i}]: unknown engine {r.engine!r}")
            if r.t_s < last:
                raise ValueError(f"{self.name}: requests[{i}]: not in arrival order")
            last = r.t_s
            e = self.engine(r.engine)
            for p, g in e.growth_split(r.growth_bytes).items():
                if g > e.size_bytes[p] - e.base_bytes[p]:
                    raise ValueError(f"{self.name}: requests[{i}]: growth {g} on {p} exceeds "
                                     f"{e.name}'s size − base")
            if r.service_s <= 0 or r.ramp_s < 0:
                raise ValueError(f"{self.name}: requests[{i}]: service_s must be > 0, ramp_s >= 0")
        for i, c in enumerate(self.clients):
            self._check_client(i, c, names)
        return self

    def _check_client(self, i: int, c: ClientSpec, names: set[str]) -> None:
        where = f"{self.name}: clients[{i}]"
        for e in (c.engine, *c.engines):
            if e not in names:
                raise ValueError(f"{where}: unknown engine {e!r}")
        if c.service_s <= 0 or c.pause_s < 0 or c.until_s < c.start_s:
            raise ValueError(f"{where}: need service_s > 0, pause_s >= 0, until_s >= start_s")
        if c.weights and (len(c.weights) != len(c.engines) or min(c.weights) < 0
                          or sum(c.weights) <= 0):
            raise ValueError(f"{where}: weights {list(c.weights)!r}: need one weight >= 0 per "
                             f"engine of {list(c.engines)!r}, not all 0")
        if c.burst < 1 or c.burst_gap_s < 0:
            raise ValueError(f"{where}: need burst >= 1 and burst_gap_s >= 0, got {c.burst} and "
                             f"{c.burst_gap_s}")
        if c.pause_max_s is not None and c.pause_max_s < c.pause_s:
            raise ValueError(f"{where}: pause_max_s {c.pause_max_s} < pause_s {c.pause_s}")
        if c.service_max_s is not None and c.service_max_s < c.service_s:
            raise ValueError(f"{where}: service_max_s {c.service_max_s} < service_s "
                             f"{c.service_s}")

    # -- files ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Workload":
        d = json.loads(Path(path).read_text())
        try:
            return cls(
                name=d["name"], description=d["description"], seed=int(d["seed"]),
                duration_s=float(d["duration_s"]), host_ram_bytes=int(d["host_ram_bytes"]),
                cards=tuple(CardSpec(**c) for c in d["cards"]),
                engines=tuple(EngineSpec(**e) for e in d["engines"]),
                requests=tuple(RequestSpec(*r) for r in d["requests"]),
                mechanisms=Mechanisms(**d.get("mechanisms", {})),
                generator=d.get("generator", {}),
                clients=tuple(ClientSpec(**c) for c in d.get("clients", [])),
            ).validate()
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a workload file ({exc})") from exc

    def dump(self, path: str | Path) -> None:
        """Write the workload as JSON, one request per line (``[t_s, engine, service_s,
        growth_bytes, ramp_s, kind]``) so that diffs stay readable."""
        head = {k: v for k, v in asdict(self).items() if k != "requests"}
        head["cards"] = [asdict(c) for c in self.cards]
        # ``free`` is written only where it is set: files written before issue 25 stay as they were.
        head["engines"] = [{k: v for k, v in asdict(e).items() if k != "free" or v}
                           for e in self.engines]
        if self.clients:
            # A fixed-engine client's file stays as issue 24 wrote it: only the fields set.
            plain = ClientSpec("", 0.0, 0.0, 0.0, 1.0)
            head["clients"] = [{k: v for k, v in asdict(c).items()
                                if k in _CLIENT_CORE or v != getattr(plain, k)}
                               for c in self.clients]
        else:
            head.pop("clients", None)
        text = json.dumps(head, indent=1)[:-2]
        rows = [json.dumps([round(r.t_s, 3), r.engine, round(r.service_s, 3), r.growth_bytes,
                            round(r.ramp_s, 3), r.kind]
                           + ([r.leave_s] if r.leave_s is not None else []))
                for r in self.requests]
        text += ',\n "requests": [\n  ' + ",\n  ".join(rows) + "\n ]\n}\n"
        Path(path).write_text(text)
