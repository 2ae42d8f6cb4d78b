"""The board: berthd's state as DESIGN.md's ``berth status --json`` keys (bytes, seconds).

Source: DESIGN.md "berth status"; issue 7 (orphans, waiters that already run). Read-only: it
changes nothing, so the API may call it outside the single writer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from berth.decide.admission import Policy, WaitKind
from berth.decide.ledger import RESIDUAL_SLACK_BYTES, counted_bytes
from berth.decide.measures import reserve_fraction, suggested_reserve
from berth.decide.model import Lease, Share, ShareState
from berth.decide.moves import move_block
from berth.decide.reports import contender
from berth.decide.turns import idle_forecast, turn_end
from berth.decide.units import format_size
from berth.process import ProcessId, alive

if TYPE_CHECKING:
    from berth.daemon.broker import Broker

__all__ = ["board", "protection"]

S = ShareState


def board(broker: "Broker") -> dict:
    """The board as DESIGN.md's ``berth status --json`` keys (bytes, seconds)."""
    led = broker.sched.ledger
    cards = _card_rows(broker)
    now = broker.clock()
    counters = broker.sched.counters.as_dict()
    counters["reserve_fraction"] = round(reserve_fraction(led), 4)
    ram = {"budget_bytes": led.ram_budget_bytes, "parked_bytes": led.parked_in_ram_bytes(),
           "available_bytes": led.ram_available_bytes()}
    return {"cards": cards, "leases": _lease_rows(broker, now),
            "waiting": _waiting_rows(broker, now), "counters": counters,
            "drained": _drained_rows(broker),
            "host_ram": ram, "driver": broker.driver.kind, "adapters": _adapters(broker),
            "host_notes": broker.host_notes.values() if hasattr(broker, "host_notes") else [],
            "uptime_s": round(now - broker.started_at, 1)}


def _card_rows(broker: "Broker") -> list[dict]:
    """The board's ``cards``: one row per card (bytes), with its suggested reserve."""
    led = broker.sched.ledger
    sugg = suggested_reserve(led, broker.sched.growth, broker.cfg.policy.read_interval)
    cards = []
    for pci, c in led.cards.items():
        v = led.view(pci)
        shares = _card_shares(led, pci)
        cards.append({"pci": pci, "name": c.name, "uuid": c.uuid,
                      "total_bytes": c.total_bytes, "reserve_bytes": c.reserve_bytes,
                      "baseline_bytes": c.baseline_bytes, "stowaway_bytes": c.stowaway_bytes,
                      "claim_bytes": c.claim_bytes, "claims": dict(c.claims),
                      "free_bytes": c.free_bytes, "budget_bytes": v.budget_bytes,
                      "available_bytes": v.available_bytes, "counted_bytes": v.counted_bytes,
                      "earmarked_bytes": v.earmarked_bytes,
                      "suggested_reserve_bytes": sugg[pci]["suggested_bytes"],
                      "reserve_below_suggested": sugg[pci]["below"], "shares": shares,
                      "stowaways": _stowaways(broker, pci)})
    return cards


def _lease_rows(broker: "Broker", now: float) -> list[dict]:
    """The board's ``leases``: one row per lease (bytes, seconds on ``broker.clock``)."""
    led = broker.sched.ledger
    wall = time.time()
    policy = broker.sched.policy
    leases = []
    for le in led.leases.values():
        rival = contender(broker.sched.state, le)
        extra = {**_orphans(broker, le), **_escapees(broker, le),
                 **protection(le, policy, now, wall, rival), "demand": outlook(le, policy, rival, now)}
        leases.append({**extra,
            "id": le.id, "engine": le.engine, "pid": le.pid, "start_time": le.start_time,
            "priority": le.priority, "bound": le.bound.value, "held": le.held,
            "ready": le.ready_at is not None, "in_flight": le.in_flight, "served": le.served,
            "oldest_job_age_s": None if le.oldest_job_at is None
            else round(max(0.0, now - le.oldest_job_at), 3),
            "capabilities": le.caps.as_dict(),
            # Why Berth can free none of its memory (issue 24), or None.
            "cannot_free": le.cannot_free(),
            "move": {"movable": move_block(le) is None, "why": move_block(le),  # issue 35
                     # its checkpoint restores onto another card: a wake may go elsewhere
                     "restore_across": le.caps.restore_across},
            "moving": _moving(broker, le, now),
            # A declared size far from the measured peak (issue 37), or None.
            "size_note": _size_note(le),
            "shares": [{"card": sh.card, "card_name": led.cards[sh.card].name,
                        "size_bytes": sh.size_bytes, "state": sh.state.value,
                        "reserved_bytes": sh.reserved_bytes, "used_bytes": sh.used_bytes,
                        "peak_bytes": sh.peak_bytes or None,
                        "lent_bytes": sh.lent_bytes, "residual_bytes": sh.residual_bytes,
                        "lent_to": sh.lent_to, "borrowed_from": sh.borrowed_from,
                        "in_ram_bytes": _in_ram(sh)}
                       for sh in le.shares.values()]})
    return leases


def _moving(broker: "Broker", lease: Lease, now: float) -> dict | None:
    """A move by checkpoint and restore under way (issue 35), or ``None``: ``from`` and ``to``
    (card names), ``why`` (the waiter it makes room for), ``elapsed_s`` since it began."""
    m = broker.sched.state.moving.get(lease.id)
    if m is None:
        return None
    cards = broker.sched.ledger.cards
    name = (lambda p: cards[p].name if p in cards else p)
    return {"from": [name(p) for p in m.src], "to": name(m.dst), "why": m.why,
            "elapsed_s": round(max(0.0, now - m.since), 3), "how": m.how}


def _drained_rows(broker: "Broker") -> list[dict]:
    """The board's ``drained``: runs whose engine was drained and whose front stays (issue
    35). One that moves by restart (its drain named the card it goes to) carries ``moving``
    as a lease's move does (card names, ``how`` ``"restart"``): it is a move, not a drain."""
    if not hasattr(broker, "drained"):
        return []
    cards = broker.sched.ledger.cards
    name = (lambda p: cards[p].name if p in cards else p)
    # A run whose new lease is granted leaves the list once it tells berthd it serves (a moment
    # later); until then it is listed once, as its lease (a new user saw it active and drained).
    active = {le.engine for le in broker.sched.ledger.leases.values()
              if ShareState.ACTIVE in le.states()}
    rows = [r for r in broker.drained.board() if r["engine"] not in active or r.get("move_to")]
    for r in rows:
        if r.get("move_to"):
            r["moving"] = {"from": [name(p) for p in r.get("move_from") or []] or ["?"],
                           "to": name(r["move_to"]), "why": r["why"],
                           "elapsed_s": r["drained_s"], "how": "restart"}
    return rows


def _waiting_rows(broker: "Broker", now: float) -> list[dict]:
    """The board's ``waiting``: one row per queued request, in queue order (bytes, seconds)."""
    led = broker.sched.ledger
    return [{"id": w.lease_id, "engine": led.leases[w.lease_id].engine, "kind": w.kind.value,
             "need": [{"card": p, "card_name": led.cards[p].name, "size_bytes": b}
                      for p, b in w.need.items()],
             "since": w.since, "waited_s": round(now - w.since, 3), "skips": w.skips,
             "why": broker.sched.why_waiting(w.lease_id),
             "lasting": broker.sched.wait_cause(w.lease_id)[1],
             **_running_unleased(led.leases[w.lease_id], w.kind.value)}
            for w in broker.sched.queue]


def _adapters(broker: "Broker") -> list[str]:
    """The adapters berthd loaded, sorted (the registry, group ``berth.adapters``, issue 38):
    what ``adapter = NAME`` may name until berthd restarts."""
    if broker.pm is None:
        return []
    from berth_plugins.manager import adapters
    return adapters(broker.pm)


def _card_shares(led, pci: str) -> list[dict]:
    """The shares on card ``pci`` that count there (bytes), each with its lease's size, a
    ceiling unless the lease's bound is declared (issue 37)."""
    return [{"lease": le.id, "engine": le.engine, "state": sh.state.value,
             "counted_bytes": _counted(sh), "held": le.held,
             "size_bytes": sh.size_bytes, "bound": le.bound.value, "over_bytes": _over(sh)}
            for le, sh in led.shares_on(pci) if sh.state not in (S.WAITING, S.FREED)]


def _size_note(le: Lease) -> str | None:
    """The first share whose declared size is far from its measured peak, said with the size
    to declare instead (:func:`berth.size.far_from_peak`), or ``None``."""
    from berth.size import far_from_peak
    for sh in le.shares.values():
        note = far_from_peak(sh.size_bytes, sh.peak_bytes, ceiling=le.bound.value != "declared")
        if note:
            return note
    return None


def outlook(lease: Lease, policy: Policy, waiter: Lease | None = None,
            now: float | None = None) -> dict | None:
    """An idle active holder's forecast of its demand (issue 34, :mod:`berth.decide.demand`),
    against ``waiter`` when one waits for its card: ``{"outlook": "none" | "demand" |
    "unknown", "why": "A yields at once: its client is waiting on B", "keep_s", "rent_s",
    "trust", "forecasts", "wrong"}`` (seconds; ``keep_s`` from the start of its idle spell;
    with ``now``, the broker's clock, a waiter whose request is older than any the holder
    expects ends the keep at once: "A yields at once: B's request is older than the request it
    expects"); ``None`` while it serves or holds no active share."""
    if not lease.idle() or not any(sh.state is S.ACTIVE for sh in lease.shares.values()):
        return None
    fc = idle_forecast(lease, waiter or lease, policy, waiter is not None, now)
    d = lease.demand
    return {"outlook": fc.outlook.value, "why": fc.words(lease.engine),
            "keep_s": round(fc.keep_s, 3), "rent_s": round(fc.rent_s, 3),
            "trust": round(fc.trust, 3), "forecasts": d.forecasts, "wrong": d.wrong}


def protection(lease: Lease, policy: Policy, now: float, wall: float,
               waiter: Lease | None = None) -> dict:
    """When an active holder's protections end, as ``berth.decide.turns.displaceable`` (3)
    and (4) apply them (a test holds the two together), like ``ollama ps``'s "until":

    - ``turn_left_s`` / ``turn_until``: its turn against an equal-priority waiter asking now
      (:func:`berth.decide.turns.turn_end`: the first-request window, an idle holder's rent,
      the minimum turn, a busy holder's turn up to ``max_turn``); ``idle``: nothing in flight;
    - ``keep_warm_left_s`` / ``keep_warm_until``: ``keep_warm`` after its last request; its
      priority keeps the card against lower priorities that long once idle (while it serves,
      always).

    Seconds from ``now`` (the broker's clock) and the same instant as seconds since the epoch
    (``wall`` is ``time.time()`` at ``now``); ``None`` once over, or for a holder with no
    active share. ``held``, an operator hold, protects until it is released. ``waiter``: the
    waiter its turn is judged against, when one waits (its client may end an idle holder's
    turn at once, issue 34)."""
    active = any(sh.state is S.ACTIVE for sh in lease.shares.values())
    out: dict = {"idle": lease.idle(), "turn_left_s": None, "turn_until": None,
                 "keep_warm_left_s": None, "keep_warm_until": None}
    if not active:
        return out
    ends = {"turn": turn_end(lease, policy, now, waiter),
            "keep_warm": lease.last_used_at + lease.keep_warm_s}
    for name, end in ends.items():
        if end is not None and end > now:
            out[f"{name}_left_s"] = round(end - now, 3)
            out[f"{name}_until"] = round(wall + (end - now), 3)
    return out


def _orphans(broker: "Broker", lease: Lease) -> dict:
    """Board fields for a lease whose main process is gone while processes it started still
    hold memory on its cards (issue 7; reference/hosts.md "Orphans"): ``orphans`` lists
    ``{"pid", "card", "bytes"}`` and ``note`` says what to change. Berth never signals them
    (rule 6). Empty when there are none."""
    if lease.pid is None or lease.start_time is None or alive(
            ProcessId(lease.pid, lease.start_time)):
        return {}
    found = []
    for pci, pids in broker.reads.lease_pids.get(lease.id, {}).items():
        r = broker.reads.last_reads.get(pci)
        for pid in sorted(pids):
            if r is not None and pid in r.processes and pid != lease.pid:
                found.append({"pid": pid, "card": pci, "bytes": r.processes[pid]})
    if not found:
        return {}
    held = sum(o["bytes"] or 0 for o in found)
    entry = broker.cfg.engines.get(lease.engine)
    if entry is not None and entry.supervisor:
        advice = (f"supervisord signals only a program's main process: set stopasgroup=true "
                  f"and killasgroup=true in [program:{entry.supervisor}]")
    else:
        advice = "stop them: Berth does not signal processes it did not start (rule 6)"
    return {"orphans": found,
            "note": f"main process {lease.pid} is gone but {len(found)} process(es) it "
                    f"started still hold {format_size(held)} (pids "
                    f"{', '.join(str(o['pid']) for o in found)}); {advice}"}


def _escapees(broker: "Broker", lease: Lease) -> dict:
    """``escapees``: processes counted for ``lease`` (seen in its tree) that hold memory outside
    its tree now, ``[{"pid", "card", "card_name", "bytes"}]`` (issue 36: an engine's child that
    left the run's reach, e.g. a run without a subreaper, or one killed); absent when none.
    The board and ``berth status`` name them with the lease."""
    cards = broker.sched.ledger.cards
    found = [{"pid": pid, "card": pci, "card_name": cards[pci].name if pci in cards else pci,
              "bytes": b}
             for pci, per in broker.reads.escapees.get(lease.id, {}).items()
             for pid, b in sorted(per.items())]
    return {"escapees": found} if found else {}


def _running_unleased(lease: Lease, kind: str) -> dict:
    """Board fields for a waiter whose process already runs (a host started it before its
    grant, issue 7): it holds memory without a grant, so it is over budget until room is made."""
    if kind != WaitKind.GRANT or lease.pid is None:
        return {}
    held = sum(sh.used_bytes or 0 for sh in lease.shares.values())
    return {"pid": lease.pid, "running": True, "held_bytes": held,
            "note": f"over budget: pid {lease.pid} already runs and holds {format_size(held)} "
                    f"without a grant; they count as stowaways until room is made"}


def _stowaways(broker: "Broker", pci: str) -> list[dict]:
    """The processes counted as stowaways on ``pci`` at the last driver read (held memory, no
    lease of theirs granted, not the baseline): ``[{"pid", "bytes"}]``, largest first (issue 15:
    the board names them), with ``program`` and ``user`` where the process table named them
    (issue 37; ``None`` otherwise). Empty when the driver does not list processes."""
    reads = broker.reads
    r = reads.last_reads.get(pci)
    if r is None or not getattr(r, "processes_known", True):
        return []
    led = broker.sched.ledger
    owned: set[int] = set()
    for lid, per in reads.lease_pids.items():
        le = led.leases.get(lid)
        if le is not None and not le.is_waiting():
            owned |= per.get(pci, set())
    base = reads.baseline_pids.get(pci, set())
    who = led.cards[pci].stowaway_who
    out = [{"pid": pid, "bytes": b or 0, "program": (who.get(pid) or (None, None))[0],
            "user": (who.get(pid) or (None, None))[1]}
           for pid, b in r.processes.items() if pid not in owned and pid not in base]
    return sorted(out, key=lambda x: -x["bytes"])


def _in_ram(sh: Share) -> int:
    """Host-RAM bytes a parked (parking, resuming) share holds, as the ledger counts them
    against the RAM budget (``Ledger.parked_in_ram_bytes``); 0 otherwise."""
    if sh.state not in (S.PARKED, S.PARKING, S.RESUMING):
        return 0
    return max(0, max(sh.reserved_bytes, sh.parked_bytes) - sh.residual_bytes)


def _counted(sh: Share) -> int:
    return counted_bytes(sh)


def _over(sh) -> int:
    """Bytes an active share uses past its reservation, once past the slack the scheduler
    allows before it says so (a KV block over a full lease is not "over its lease")."""
    used = sh.used_bytes or 0
    if sh.state is not S.ACTIVE or used <= sh.reserved_bytes + RESIDUAL_SLACK_BYTES:
        return 0
    return used - sh.reserved_bytes
