"""An honest world around the pure scheduler, for tests: engines that use no more than they are
granted, a driver that frees memory only after a process is gone, and effects carried out in
whatever order the test chooses. Card use here is the ground truth an OOM would be judged by."""

from __future__ import annotations

from dataclasses import dataclass, field

from berth.decide.admission import Policy
from berth.decide.model import Capabilities, Card, Lease, ParkMechanism, Share, ShareState
from berth.decide.scheduler import (
    CardRead,
    Effect,
    Ended,
    Granted,
    Instruct,
    ReadCards,
    Rejected,
    Scheduler,
    Watch,
)

GiB = 1 << 30
MiB = 1 << 20
S = ShareState


def pci_of(i: int) -> str:
    return f"0000:{i + 1:02x}:00.0"


@dataclass
class Pending:
    op: str
    lease_id: str
    cards: tuple[str, ...]
    n: dict[str, int] = field(default_factory=dict)
    call_off: bool = False


class World:
    """Cards of ``totals`` bytes; runs the scheduler's effects honestly."""

    def __init__(self, totals: list[int], policy: Policy | None = None, reserve: int = 0,
                 baseline: int = 0, stowaway: int = 0, claims: int = 0):
        # No turns unless a test asks for them: no minimum or maximum turn, no juggle guard,
        # no wait for a first request (issue 24's rules have tests of their own).
        self.s = Scheduler(policy or Policy(min_turn_s=0, juggle_window_s=0, max_turn_s=0,
                                            first_request_s=0))
        self.now = 0.0
        self.stowaway = stowaway
        self.baseline = baseline
        for i, t in enumerate(totals):
            self.s.ledger.add_card(Card(pci_of(i), f"gpu{i}", t, reserve_bytes=reserve,
                                        baseline_bytes=baseline,
                                        claims={"desktop": claims} if claims else {}))
        self.used: dict[tuple[str, str], int] = {}      # the engines' real use
        self.parked_use: dict[tuple[str, str], int] = {}
        self.alive: set[str] = set()
        self.pending: list[Pending] = []
        self.watches: list[Watch] = []
        self.effects: list[Effect] = []
        self.granted_order: list[str] = []
        self.ended: set[str] = set()
        self.rejected: set[str] = set()
        self.read()

    # -- driver ------------------------------------------------------------------------------
    def card_use(self, pci: str) -> int:
        return self.baseline + self.stowaway + sum(b for (l, p), b in self.used.items() if p == pci)

    def read(self) -> None:
        reads = {}
        for pci, card in self.s.ledger.cards.items():
            used = {lid: b for (lid, p), b in self.used.items() if p == pci
                    and lid in self.s.ledger.leases}
            reads[pci] = CardRead(free_bytes=card.total_bytes - self.card_use(pci),
                                  stowaway_bytes=self.stowaway, used=used)
        self.apply(self.s.observe(reads, self.now))

    # -- events ------------------------------------------------------------------------------
    def request(self, lid: str, engine: str, sizes: dict[str, int], *, priority: int = 0,
                park: ParkMechanism | None = None, lend: bool = False, bound=None,
                need: dict[str, int] | None = None, growth: int = 0,
                lend_max: int | None = None) -> None:
        from berth.decide.model import Bound
        caps = Capabilities(park=park, lend=lend, lend_max_bytes=lend_max,
                            front="127.0.0.1:1" if (park or lend) else None)
        lease = Lease(lid, engine, {p: Share(p, b) for p, b in sizes.items()}, priority=priority,
                      caps=caps, bound=bound or Bound.DECLARED, need_bytes=need or {},
                      growth_allowance_bytes=growth)
        self.apply(self.s.request(lease, self.now))

    def advance(self, dt: float) -> None:
        self.now += dt
        self.apply(self.s.tick(self.now))

    def apply(self, fx: list[Effect]) -> None:
        ready = []
        read = False
        for e in fx:
            self.effects.append(e)
            if isinstance(e, Granted):
                self.granted_order.append(e.lease_id)
                self.alive.add(e.lease_id)
                for pci, b in e.cards.items():
                    self.used[(e.lease_id, pci)] = b      # an engine that fills its share
                ready.append(e.lease_id)                  # ... and loads at once
            elif isinstance(e, Instruct):
                self.pending.append(Pending(e.op, e.lease_id, e.cards, dict(e.bytes),
                                            e.call_off))
            elif isinstance(e, Watch):
                self.watches.append(e)
            elif isinstance(e, Ended):
                self.ended.add(e.lease_id)
            elif isinstance(e, Rejected):
                self.rejected.add(e.lease_id)
            elif isinstance(e, ReadCards):
                read = True                                # the broker reads at once (rule 1)
        self.check_no_oom()
        if read:
            self.read()
        for lid in ready:
            if lid in self.s.ledger.leases and lid in self.alive:
                self.apply(self.s.ready(lid, self.now))

    def do(self, i: int = 0, ok: bool = True, frees: bool = True) -> Pending:
        """Carry out pending instruction ``i``. ``ok``: the engine's answer; ``frees``: whether
        a park or lend really frees memory (an engine can acknowledge and free nothing)."""
        p = self.pending.pop(i)
        lease = self.s.ledger.leases.get(p.lease_id)
        if lease is None or p.lease_id not in self.alive:
            return p
        if p.call_off:
            # As berth run does: a park whose mechanism has not begun (still pending here) is
            # called off; one that has begun finishes, and the call-off does nothing more.
            parks = [q for q in self.pending if q.op == "park" and q.lease_id == p.lease_id]
            if parks:
                self.pending.remove(parks[0])
                self.apply(self.s.report(p.lease_id, "park", False, self.now,
                                         "called off: the waiter has gone"))
            return p
        if p.op == "park":
            for pci in p.cards:
                key = (p.lease_id, pci)
                if frees and ok and key in self.used:
                    self.parked_use[key] = self.used[key]
                    residual = 0 if lease.caps.park is ParkMechanism.CHECKPOINT else 64 * MiB
                    self.used[key] = min(self.used[key], residual)
            self.apply(self.s.report(p.lease_id, "park", ok, self.now))
        elif p.op == "lend":
            for pci, n in p.n.items():
                key = (p.lease_id, pci)
                if frees and ok:
                    self.used[key] = min(self.used.get(key, 0), lease.shares[pci].reserved_bytes - n)
            self.apply(self.s.report(p.lease_id, "lend", ok, self.now))
        elif p.op == "wake":
            if ok:
                # A checkpoint restored onto other cards (issue 35) takes its bytes there.
                away = [k for k in self.parked_use if k[0] == p.lease_id and k[1] not in p.cards]
                for pci in p.cards:
                    key = (p.lease_id, pci)
                    if key in self.parked_use:
                        self.used[key] = self.parked_use.pop(key)
                    elif away:
                        old = away.pop(0)
                        self.used.pop(old, None)
                        self.used[key] = self.parked_use.pop(old)
            self.apply(self.s.report(p.lease_id, "wake", ok, self.now))
        elif p.op == "return":
            if ok:
                for pci in p.cards:
                    self.used[(p.lease_id, pci)] = lease.shares[pci].reserved_bytes
            self.apply(self.s.report(p.lease_id, "return", ok, self.now))
        elif p.op == "drain":
            self.alive.discard(p.lease_id)      # the process exits; memory frees later
            self.apply(self.s.report(p.lease_id, "drain", True, self.now))
        return p

    def do_all(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            if not self.pending and not self.watches:
                return
            while self.pending:
                self.do(0)
            self.confirm_all()

    def exit(self, lid: str) -> None:
        """The engine exits on its own."""
        self.alive.discard(lid)
        self.apply(self.s.exited(lid, self.now))

    def confirm(self, i: int) -> bool:
        """Let the driver confirm watch ``i`` if the world shows it; True if it did."""
        w = self.watches[i]
        key = (w.lease_id, w.pci)
        lease = self.s.ledger.leases.get(w.lease_id)
        if lease is None:
            self.watches.pop(i)
            return True
        if w.until == "freed":
            if w.lease_id in self.alive:
                return False
            self.used.pop(key, None)
            self.parked_use.pop(key, None)
            self.watches.pop(i)
            self.read()              # the confirming read is a driver read like any other
            self.apply(self.s.confirmed(w.lease_id, w.pci, "freed", self.now))
            return True
        use = self.used.get(key, 0)
        if use <= w.max_use_bytes:
            self.watches.pop(i)
            self.read()
            self.apply(self.s.confirmed(w.lease_id, w.pci, w.until, self.now, use_bytes=use))
            return True
        return False

    def confirm_all(self) -> None:
        progress = True
        while progress:
            progress = False
            for i in range(len(self.watches) - 1, -1, -1):
                if i < len(self.watches) and self.confirm(i):
                    progress = True

    # -- invariants --------------------------------------------------------------------------
    def check_no_oom(self) -> None:
        for pci, card in self.s.ledger.cards.items():
            assert self.card_use(pci) <= card.total_bytes, f"OOM on {pci}"

    def check(self) -> None:
        led = self.s.ledger
        led.check()
        for pci, card in led.cards.items():
            cap = card.total_bytes - card.reserve_bytes - card.baseline_bytes \
                - card.stowaway_bytes - card.claim_bytes
            assert led.counted(pci) <= cap, (pci, led.counted(pci), cap)
            # Real use never spends the reserve either: engines use no more than they count.
            assert self.card_use(pci) <= card.total_bytes - card.reserve_bytes - card.claim_bytes
        from berth.decide.ledger import counted_bytes
        from berth.decide.model import TRANSITIONS
        for lease in led.leases.values():
            for pci, sh in lease.shares.items():
                prev = S.WAITING
                for src, dst, _ in sh.history:
                    assert src == prev, f"{lease.id}@{pci}: history jumps {prev} -> {src}"
                    assert dst in TRANSITIONS[src], (src, dst)
                    prev = dst
                assert prev == sh.state
                if sh.state is S.LENT and sh.lent_to:
                    b = led.leases[sh.lent_to].shares[pci]
                    assert b.borrowed_from == lease.id
                    assert b.reserved_bytes == sh.lent_bytes
                    assert counted_bytes(sh) + counted_bytes(b) == sh.reserved_bytes
