"""The lease model: cards, leases, shares and the share state machine, as pure data.

Source: seed 002 "The data model" and "Capabilities". Nothing here does I/O or reads a clock;
times are passed in as ``now`` (seconds, any monotonic origin).

A *card* is named by its normalised PCI address. A *lease* belongs to one engine run and holds one
*share* per card it uses. A share's state is one machine, so it can never be parked and lending at
once::

    waiting ─▶ active ─┬─▶ draining ─▶ released ─▶ freed
                       ├─▶ parking ─▶ parked ─▶ resuming ─▶ active
                       └─▶ lending(N) ─▶ lent(N) ─▶ returning ─▶ active

:data:`TRANSITIONS` is that diagram, plus the edges the seed's own rules name (each labelled
below); :func:`move` is the only place a share's state changes.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

# Bound, names_card and DEFAULT_KEEP_WARM_S live in .kinds, which the config schema reads
# without this module's dataclasses.
from .kinds import DEFAULT_KEEP_WARM_S, Bound, names_card
from .pci import normalize_pci

__all__ = [
    "ShareState", "Bound", "ParkMechanism", "TRANSITIONS", "DIAGRAM_EDGES", "RULE_EDGES",
    "IllegalTransition", "Capabilities", "Share", "Lease", "Card", "normalize_pci", "names_card", "move", "Op", "OPS",
    "capacity_bytes", "Demand",
    "LIVE_STATES", "ASLEEP_STATES", "SETTLED_STATES", "HOLDING_STATES",
]


class ShareState(enum.StrEnum):
    """The seed's share states (seed 002 "The data model"), spelled as the seed spells them."""

    WAITING = "waiting"
    ACTIVE = "active"
    DRAINING = "draining"
    RELEASED = "released"
    FREED = "freed"
    PARKING = "parking"
    PARKED = "parked"
    RESUMING = "resuming"
    LENDING = "lending"
    LENT = "lent"
    RETURNING = "returning"


S = ShareState

#: The diagram of seed 002, edge for edge.
DIAGRAM_EDGES: frozenset[tuple[ShareState, ShareState]] = frozenset({
    (S.WAITING, S.ACTIVE),        # a grant
    (S.ACTIVE, S.DRAINING),       # drain: the holder stops
    (S.DRAINING, S.RELEASED),     # the process is gone
    (S.RELEASED, S.FREED),        # a driver read confirms the memory free (rule 1)
    (S.ACTIVE, S.PARKING),        # park or checkpoint begins
    (S.PARKING, S.PARKED),        # a driver read confirms the memory left
    (S.PARKED, S.RESUMING),       # room confirmed, the wake begins
    (S.RESUMING, S.ACTIVE),       # the wake answered
    (S.ACTIVE, S.LENDING),        # lend(N) begins
    (S.LENDING, S.LENT),          # a driver read confirms N bytes left the holder
    (S.LENT, S.RETURNING),        # the borrower's memory is confirmed gone (rule 2)
    (S.RETURNING, S.ACTIVE),      # the holder grew back
})

#: Edges the seed's rules require beyond the diagram. Each names its rule.
RULE_EDGES: frozenset[tuple[ShareState, ShareState]] = frozenset({
    # Rule 4, "every sleep has a way back and a fallback": a park or lend that does not free the
    # memory within the release grace falls back to a drain; a wake that does not answer, and a
    # return that does not, stop the engine.
    (S.PARKING, S.DRAINING),
    (S.LENDING, S.DRAINING),
    (S.RESUMING, S.DRAINING),
    (S.RETURNING, S.DRAINING),
    # "A share that loads more than it may while asleep goes back to active and is reported
    # (lease.unparked), so the next drain parks it again."
    (S.PARKED, S.ACTIVE),
    # An operator or the ladder may drain a sleeping or lent holder outright (a parked engine is
    # still a process; "drain: the holder stops").
    (S.PARKED, S.DRAINING),
    (S.LENT, S.DRAINING),
    # Rule 1, "the driver decides": a process that dies on its own in any live state leaves
    # memory that counts until a driver read shows it free.
    (S.ACTIVE, S.RELEASED),
    (S.PARKING, S.RELEASED),
    (S.PARKED, S.RELEASED),
    (S.RESUMING, S.RELEASED),
    (S.LENDING, S.RELEASED),
    (S.LENT, S.RELEASED),
    (S.RETURNING, S.RELEASED),
    # A waiter withdrawn before its grant never held memory.
    (S.WAITING, S.FREED),
    # Rule 5, "state survives the daemon": a share caught mid-transition when berthd died is
    # settled by a driver read on restart. A park or lend whose memory never left settles
    # back to active (issue 4).
    (S.PARKING, S.ACTIVE),
    (S.LENDING, S.ACTIVE),
})

#: Allowed next states, by state.
TRANSITIONS: dict[ShareState, frozenset[ShareState]] = {
    st: frozenset(b for (a, b) in DIAGRAM_EDGES | RULE_EDGES if a == st) for st in ShareState
}

#: States whose holder process may still touch the card.
LIVE_STATES = frozenset({S.ACTIVE, S.DRAINING, S.PARKING, S.PARKED, S.RESUMING, S.LENDING,
                         S.LENT, S.RETURNING})
#: States in which the engine is asleep or on its way there (its front must hold requests).
ASLEEP_STATES = frozenset({S.PARKING, S.PARKED, S.RESUMING})
#: States that are not waiting on an effect to complete.
SETTLED_STATES = frozenset({S.WAITING, S.ACTIVE, S.PARKED, S.LENT, S.FREED})
#: States that count bytes on the card (everything but waiting and freed).
HOLDING_STATES = frozenset(ShareState) - {S.WAITING, S.FREED}


class Op(enum.StrEnum):
    """An operation berthd instructs a run or a host to carry out on a lease (seed 002, "Making
    room"); the value is the wire name in the control API's instructions and reports."""

    PARK = "park"
    WAKE = "wake"
    LEND = "lend"
    RETURN = "return"
    DRAIN = "drain"


#: Every operation's wire name, for validating a report.
OPS: frozenset[str] = frozenset(Op)


class ParkMechanism(enum.StrEnum):
    """How an engine's memory moves to RAM and back (seed 002 "Capabilities")."""

    HOOK = "hook"
    CHECKPOINT = "checkpoint"


class IllegalTransition(ValueError):
    """A share was asked to take an edge the state machine does not have.

    Attributes ``share`` (the :class:`Share`), ``src`` and ``dst`` (:class:`ShareState`).
    """

    def __init__(self, share: "Share", src: ShareState, dst: ShareState):
        self.share, self.src, self.dst = share, src, dst
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none"
        super().__init__(f"share on {share.card}: illegal transition {src} -> {dst} "
                         f"(allowed from {src}: {allowed})")


@dataclass(frozen=True)
class Capabilities:
    """What an engine entry declared it can do; the broker uses nothing it did not declare.

    - ``park``: ``None``, ``"hook"`` or ``"checkpoint"`` (seed 002 "Capabilities").
    - ``lend``: ``True`` when the engine speaks the lend hook of the Berth protocol.
    - ``lend_max_bytes``: the most it may lend on one card; ``None`` lets the ladder lend up to
      the share's size less its measured use (half its size while use is unknown).
    - ``front``: where its requests enter (``"host:port"``, ``"gateway"``, ``"comfyui-port"``).
      Rule 3: park and lend need a front; :meth:`can_sleep` says whether both hold.
    - ``drain``: Berth can stop its process (a run it started, or a program its host's manager
      stops). ``False`` for an in-process host that Berth must never stop (the ComfyUI node,
      rule 6): such a lease makes room only by a park (issue 24).
    - ``no_park``: why a host registered without a park, in words (``"--highvram: unloading
      frees nothing"``), named to whoever waits for its card.
    - ``pinned``: why the engine's own command pins its card, in words (issue 35): Berth never
      moves it to another card.
    - ``restore_across``: its park is a checkpoint and the tool restores onto another card of
      the same kind (``cuda-checkpoint --device-map``, driver 580+; issue 35): a wake may be
      placed on another card, as a grant is (:func:`.placement.choose`).
    """

    park: ParkMechanism | None = None
    lend: bool = False
    lend_max_bytes: int | None = None
    front: str | None = None
    drain: bool = True
    no_park: str | None = None
    pinned: str | None = None
    restore_across: bool = False

    def can_park(self) -> bool:
        return self.park is not None and self.front is not None

    def can_lend(self) -> bool:
        return self.lend and self.front is not None

    def as_dict(self) -> dict:
        return {"park": self.park.value if self.park else None, "lend": self.lend,
                "lend_max_bytes": self.lend_max_bytes, "front": self.front,
                "drain": self.drain, "no_park": self.no_park, "pinned": self.pinned,
                "restore_across": self.restore_across}


@dataclass
class Share:
    """The lease on one card: a size and a state (seed 002 "The data model").

    Sizes are bytes. ``size_bytes`` is the declared maximum (``whole_card`` when the lease asked
    for the card; it is then set at the grant). ``reserved_bytes`` is what admission reserved under
    the lease's bound; ``used_bytes`` the last driver read of the holder's use (``None`` while
    unknown), ``peak_bytes`` the highest of those reads since the grant (its high-water mark,
    issue 37: what ``berth size`` suggests a size from). ``lent_bytes`` is N in lending(N)/lent(N)/returning(N); ``residual_bytes`` is what a parked share
    leaves on the card, as the driver measured it; ``parked_bytes`` what it counted when its park
    began (its reservation, or its real use if larger): what a wake will bring back. ``lent_to``/``borrowed_from`` link a lend's two
    shares by lease id.
    """

    card: str
    size_bytes: int
    state: ShareState = S.WAITING
    whole_card: bool = False
    reserved_bytes: int = 0
    used_bytes: int | None = None
    peak_bytes: int = 0
    lent_bytes: int = 0
    residual_bytes: int = 0
    parked_bytes: int = 0
    lent_to: str | None = None
    borrowed_from: str | None = None
    since: float = 0.0
    history: list[tuple[ShareState, ShareState, float]] = field(default_factory=list)

    HISTORY_KEEP = 64


def move(share: Share, dst: ShareState, now: float) -> tuple[ShareState, ShareState]:
    """Move ``share`` to ``dst`` along a legal edge; the only place a share's state changes.

    Records the edge and the time in ``share.history`` (the newest :attr:`Share.HISTORY_KEEP`).
    Returns ``(src, dst)``. Raises :class:`IllegalTransition` for an edge not in
    :data:`TRANSITIONS`; the share is then unchanged.
    """
    src = share.state
    if dst not in TRANSITIONS[src]:
        raise IllegalTransition(share, src, dst)
    share.state = dst
    share.since = now
    share.history.append((src, dst, now))
    if len(share.history) > Share.HISTORY_KEEP:
        del share.history[: len(share.history) - Share.HISTORY_KEEP]
    return src, dst


#: How many idle gaps and arrivals a lease's :class:`Demand` keeps (the newest).
DEMAND_KEEP = 8
#: How many arrival times a lease's :class:`Demand` keeps (issue 35).
ARRIVALS_KEEP = 64


@dataclass
class Demand:
    """What a lease's front saw of its requests' clients, for the forecast of
    :mod:`berth.decide.demand` (issue 34). Times are the broker's clock (seconds); a client is
    a key its front made (a hash of the client's address, never the address itself), ``None``
    when unknown.

    - ``answered_client`` / ``answered_at``: the client of the last answer its front delivered,
      and when that answer ended; ``answers``: when its last answer to each of its recent
      clients ended (at most :data:`DEMAND_KEEP` clients; issue 34, third pass: beside a busy
      client, the last answer alone forgets the one that moved on);
    - ``asked_client`` / ``asked_at``: the client of the oldest request at its front now (the
      one that asked for its wake or its grant) and when it arrived; ``None`` when none;
      ``asked_moved``: whether that client's last answer, as known when the request arrived,
      came from another engine (``True``: it moves between engines), ``None`` when not known
      (issue 34, third pass: :func:`berth.decide.turns.batches`);
    - ``gaps``: its last idle gaps, seconds from an answer's end to the next request's arrival;
    - ``moved``: for its last requests that arrived while another engine held its card, whether
      each came from the client that engine had just answered (``True``: a client that moves
      between engines) or not (``False``: a client of its own);
    - ``arrivals``: when its last requests came to a front that had none (at most
      :data:`ARRIVALS_KEEP`; issue 35: how much a park or drain of it would cost its clients);
    - ``error``: its recent rate of wrong forecasts, in [0, 1] (an exponential average);
      ``forecasts`` / ``wrong``: how many were settled, and how many of them were wrong;
    - ``pending``: ``(idle_from, rent_s)`` of a **no demand** forecast it yielded under, settled
      by its next request; ``unsettled``: that request came while another engine held its card,
      and whether it moved here is settled when it gets the card back.
    """

    answered_client: str | None = None
    answered_at: float | None = None
    answers: dict[str, float] = field(default_factory=dict)
    asked_client: str | None = None
    asked_at: float | None = None
    asked_moved: bool | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=DEMAND_KEEP))
    moved: deque[bool] = field(default_factory=lambda: deque(maxlen=DEMAND_KEEP))
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEEP))
    error: float = 0.0
    forecasts: int = 0
    wrong: int = 0
    pending: tuple[float, float] | None = None
    unsettled: bool = False


#: The most model IDs a lease names besides its engine's (``aliases``): berthd's lease body
#: refuses more, and ``berth run`` refuses more ``--alias`` values before anything starts.
MAX_ALIASES = 32


@dataclass
class Lease:
    """One engine run's claim on memory: one :class:`Share` per card, keyed by PCI address.

    ``priority``: higher wins. ``pid``/``start_time``: the engine's process identity (PID plus
    its start time in seconds since the epoch, as psutil reports it), ``None`` until attached.
    ``owner_pid``/``owner_start_time``: the process that asked for the lease (``berth run`` or
    a host plugin), so a lease still waiting can be re-attached or dropped after a restart.
    ``reaper``: that owner is a child subreaper (``berth run``): every descendant of it but
    itself is the engine's, from its first byte (issue 36); kept in the state file, so a
    restarted berthd still counts a daemonized child's memory for the lease.
    ``growth_allowance_bytes`` is the allowance A of seed 000 for ``Bound.GROWTH``.
    ``need_bytes`` is the current need per card for ``current``/``growth`` (defaults to the size).
    ``held`` is an operator hold: a held lease is never displaced. ``ready_at`` is when the engine
    first answered after its grant (its minimum turn counts from then); ``resumed_at`` when a
    wake or a return last made it active again.
    ``in_flight`` is how many requests its front is forwarding now (the run reports it),
    ``busy_since`` when that last rose from 0; ``jobs_reported``: a front reported at least once
    (until then the holder counts as busy, since nothing says it is idle). ``keep_warm_s``: how
    long after its last request its priority still protects an idle holder (seconds; issue 16).
    ``restart_grace_s``: the holder's process may be
    restarted by its supervisor (a host such as supervisord's listener says so at the request):
    when it exits on its own while active, its room is kept up to this many seconds for the new
    process, which the host attaches, or releases for good (issue 12 case 2).
    ``restarting_until`` is when that hold ends (``None``: no hold running).
    ``max_job_s``: how long the ladder waits for its requests in flight before displacing it
    anyway (``None``: the policy's ``max_job_s``); ``may_preempt`` lets it, when of higher
    priority, displace a busy holder without waiting (issue 12 case 4). ``switch_cost_s``: what
    its last start cost, measured (seconds from the grant to ``ready``, or from the wake's
    instruction to its report); its minimum turn is at least that long (issue 16).
    ``oldest_job_at``: when the oldest request its front has now (held or forwarded) arrived,
    as the front reports it (``None``: not reported); a busy holder keeps its card for a waiter
    that asked later than that (issue 16: no engine waits longer than under FIFO swapping).
    ``held_jobs``: how many of ``in_flight`` its front holds, not yet forwarded (its slots
    are full), and ``oldest_held_at`` when the oldest of those arrived (``None``: none held, or
    not said): a holder that holds requests is parked fenced at once rather than kept for its
    older ones, since the instant they end its front would forward the held ones, newer than
    the waiter's, and the park would wait for them (issue 34, the fence).
    ``idle_since``: when its front last reported nothing in flight (``None`` while busy or
    before any report); ``last_job_at``: when it last reported a request. ``served``: how many
    model requests its front has reported started during this lease (a count that moves between
    two reports is a request that came and went unseen by the in-flight samples). An idle
    holder keeps its card while it has been idle less than switching back would cost (rent or
    buy, issue 24). ``park_cost_s``: what its last park of an idle engine cost, measured
    (seconds from the instruction to the driver's confirmation); ``parking_since`` when that
    park began.
    ``frees_nothing``: why its park was seen to free nothing (a lease that cannot be drained
    then keeps its card, and waiters are told at once).
    ``movable``: the PCI addresses of the shares that named no card; while the lease waits,
    Berth places them anew at every admission pass (issue 25: placement at grant time). A
    granted lease keeps its cards; a parked one wakes on them.
    ``demand``: what its front saw of its clients, for the forecast of whether a request for it
    comes within a switch back (:class:`Demand`, issue 34).
    ``makes_room``: ``False`` for a waiter that no holder makes room for (no lend, park, drain
    or move): it is granted when room frees by itself. A drained run with no front asks so
    when it asks for its card again (issue 35): no request shows that it is wanted, so a drain
    back would only swap the two engines (supervisord's programs, endlessly at ``min_turn``
    0s).
    """

    id: str
    engine: str
    shares: dict[str, Share]
    priority: int = 0
    bound: Bound = Bound.DECLARED
    growth_allowance_bytes: int = 0
    need_bytes: dict[str, int] = field(default_factory=dict)
    caps: Capabilities = field(default_factory=Capabilities)
    pid: int | None = None
    start_time: float | None = None
    owner_pid: int | None = None
    owner_start_time: float | None = None
    reaper: bool = False
    requested_at: float = 0.0
    granted_at: float | None = None
    ready_at: float | None = None
    resumed_at: float = 0.0
    last_used_at: float = 0.0
    held: bool = False
    in_flight: int = 0
    busy_since: float | None = None
    jobs_reported: bool = False
    keep_warm_s: float = DEFAULT_KEEP_WARM_S
    restart_grace_s: float = 0.0
    restarting_until: float | None = None
    max_job_s: float | None = None
    may_preempt: bool = False
    switch_cost_s: float = 0.0
    oldest_job_at: float | None = None
    held_jobs: int = 0
    oldest_held_at: float | None = None
    idle_since: float | None = None
    last_job_at: float | None = None
    served: int = 0
    park_cost_s: float = 0.0
    parking_since: float | None = None
    frees_nothing: str | None = None
    movable: frozenset[str] = frozenset()
    demand: Demand = field(default_factory=Demand)
    makes_room: bool = True

    def idle(self) -> bool:
        """Nothing in flight at its front, as its front last reported (issue 16: turns protect
        work, not idleness). A holder whose front never reported is not idle."""
        return self.jobs_reported and self.in_flight == 0

    def cannot_free(self) -> str | None:
        """Why Berth can free none of this lease's memory, in words, or ``None``: it cannot be
        drained (an in-process host) and it has no park that frees anything (issue 24)."""
        if self.caps.drain:
            return None
        if not self.caps.can_park():
            return self.caps.no_park or "it registered without a park"
        return self.frees_nothing

    @property
    def cards(self) -> list[str]:
        return list(self.shares)

    def states(self) -> set[ShareState]:
        return {s.state for s in self.shares.values()}

    def is_waiting(self) -> bool:
        return all(s.state is S.WAITING for s in self.shares.values())

    def is_over(self) -> bool:
        return all(s.state is S.FREED for s in self.shares.values())


def capacity_bytes(total: int, reserve: int, baseline: int, claims: dict[str, int]) -> int:
    """The most any set of shares could ever count on a card, in bytes: total − reserve −
    baseline − Σ claims (seed 000 "budget"). The one formula, for the ledger and the config
    check alike."""
    return total - reserve - baseline - sum(claims.values())


@dataclass
class Card:
    """One card, named by its normalised PCI address (seed 002 "Card").

    Bytes: ``total_bytes`` from the driver; ``reserve_bytes`` the floor, never granted (seed 000
    "The watermark"); ``baseline_bytes`` what the card uses with no process on it (driver
    context, display); ``stowaway_bytes`` what processes outside any lease hold, and
    ``stowaways`` the same by PID (issue 12 case 5); ``claims`` bytes the operator sets
    aside for users outside Berth, by name. ``free_bytes`` is the last driver read (``None``
    before the first) and ``read_at`` its time. ``freeing``: memory whose process is gone (its
    PID left the driver's list) but that the driver does not show free yet, by engine:
    ``(bytes, since)`` (a release under way, issue 24; real drivers free after the PID goes).
    """

    pci: str
    name: str
    total_bytes: int
    reserve_bytes: int = 0
    baseline_bytes: int = 0
    stowaway_bytes: int = 0
    stowaways: dict[int, int] = field(default_factory=dict)
    #: ``(program, user)`` of each stowaway PID the process table named (issue 37).
    stowaway_who: dict[int, tuple[str, str]] = field(default_factory=dict)
    claims: dict[str, int] = field(default_factory=dict)
    free_bytes: int | None = None
    read_at: float | None = None
    uuid: str | None = None
    freeing: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def claim_bytes(self) -> int:
        return sum(self.claims.values())

    @property
    def capacity_bytes(self) -> int:
        """The most any set of shares could ever count here: total − reserve − baseline − claims."""
        return capacity_bytes(self.total_bytes, self.reserve_bytes, self.baseline_bytes,
                              self.claims)
