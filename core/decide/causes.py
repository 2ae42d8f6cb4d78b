"""Why a waiter waits, in words, and whether anything under way could end the wait.

Source: issue 12 cases 4 and 6; seed 002 "Fronts" ("a held request ends ... with a 503 that names
the reason"). Every held request's answer names its cause: a holder (engine, priority, requests in
flight), a stowaway (PID, bytes), or the reserve. A cause is *lasting* when nothing under way
could change it (no release being confirmed, no room being made, no minimum turn or juggle guard
running out): the front then answers at once instead of holding the request to its wait limit.

Pure: no I/O, no clock, no logging. Time is the ``now`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import Ledger, counted_bytes
from .model import Card, Lease, ShareState
from .units import format_size

__all__ = ["Cause", "jobs_words", "holder_words", "stowaway_words", "quiet_bound_s",
           "max_job_s", "card_causes", "TRANSIT_STATES"]

S = ShareState

#: States in which a share's memory is on its way somewhere: the card's free bytes will change
#: without any new event from outside, so a wait behind one is not lasting.
TRANSIT_STATES = frozenset({S.DRAINING, S.RELEASED, S.PARKING, S.LENDING, S.RESUMING,
                            S.RETURNING})


@dataclass(frozen=True)
class Cause:
    """One thing standing between a waiter and its room. ``kind``: ``holder``, ``stowaway``,
    ``reserve``, ``release`` (memory being confirmed free or moving), ``turn`` (a minimum turn
    or the juggle guard, which run out). ``lasting``: nothing under way could change it."""

    kind: str
    text: str
    lasting: bool


def jobs_words(n: int) -> str:
    """``"1 request in flight"``, ``"0 requests in flight"``."""
    return f"{n} request{'' if n == 1 else 's'} in flight"


#: A holder whose requests nothing reports, in words (no front: a supervisord program, a run
#: without ``--front``); it counts as busy.
UNREPORTED = "requests in flight unknown: nothing reports them (no front), so it counts as busy"
#: A holder with a front that has not reported its requests yet (a run re-attached after a
#: berthd restart reports them at its next request); it counts as busy meanwhile.
UNREPORTED_YET = ("requests in flight unknown: its front has not reported them yet, so it "
                  "counts as busy")


def holder_words(lease: Lease, pci: str | None = None) -> str:
    """``"boss (priority 5, 0 requests in flight) holds 14.0GiB in lease boss-77-1"``: a
    holder as a waiting client is told about it, engine and lease (issue 37). A holder whose
    front never reported its requests is said to be so in words a user can act on
    (:data:`UNREPORTED`; ``berth run --front`` gives an engine a front that reports them)."""
    held = f" holds {format_size(counted_bytes(lease.shares[pci]))}" if pci else ""
    jobs = jobs_words(lease.in_flight) if lease.jobs_reported else \
        UNREPORTED_YET if lease.caps.front else UNREPORTED
    return f"{lease.engine} (priority {lease.priority}, {jobs}){held} in lease {lease.id}"


def stowaway_words(card: Card) -> str:
    """``"stowaway pid 123 (python3 train.py, user ana) holds 20.0GiB"`` for each process on
    the card without a lease: its program and user where the process table named them (issue
    37), so that the user need not go and look."""
    if not card.stowaways:
        return f"stowaways hold {format_size(card.stowaway_bytes)}"

    def one(pid: int, b: int) -> str:
        who = card.stowaway_who.get(pid)
        named = f" ({who[0]}, user {who[1]})" if who else ""
        return f"stowaway pid {pid}{named} holds {format_size(b)}"
    return ", ".join(one(pid, b)
                     for pid, b in sorted(card.stowaways.items(), key=lambda kv: -kv[1]))


def max_job_s(lease: Lease, default_s: float) -> float:
    """The longest the ladder waits for one of this holder's jobs, seconds."""
    return lease.max_job_s if lease.max_job_s is not None else default_s


def quiet_bound_s(lease: Lease, default_max_job_s: float, now: float) -> float:
    """How long a holder's front may wait for its requests in flight before it is displaced
    anyway: what is left of its ``max_job`` since it became busy (all of it when idle)."""
    limit = max_job_s(lease, default_max_job_s)
    if lease.in_flight <= 0 or lease.busy_since is None:
        return limit
    return max(0.0, limit - (now - lease.busy_since))


def card_causes(ledger: Ledger, pci: str, waiter_id: str, gap_bytes: int,
                refusals: list[tuple[Lease, str, bool]]) -> list[Cause]:
    """What stands in the way of ``gap_bytes`` more on card ``pci`` for ``waiter_id``.

    ``refusals``: ``(holder, reason, lasting)`` for each active holder the ladder may not
    displace now. Adds the memory in transit on the card (not lasting: a share moving, or memory
    whose process is gone and that the driver has not freed yet), the stowaways, and, when
    nothing else explains the gap, the reserve."""
    card = ledger.cards[pci]
    out: list[Cause] = []
    if card.free_bytes is None:
        out.append(Cause("release", "no driver read of the card yet", False))
    for lease, sh in ledger.shares_on(pci):
        if lease.id == waiter_id or sh.state not in TRANSIT_STATES:
            continue
        what = ("being confirmed free" if sh.state in (S.DRAINING, S.RELEASED)
                else f"{sh.state.value}")
        out.append(Cause("release", f"{lease.engine}'s {format_size(counted_bytes(sh))} is "
                                    f"{what} ({sh.state.value})", False))
    for engine, (n, _since) in card.freeing.items():
        out.append(Cause("release", f"{engine}'s {format_size(n)} left with its process and "
                                    f"the driver has not freed it yet", False))
    for holder, reason, lasting in refusals:
        out.append(Cause("holder" if lasting else "turn",
                         f"{holder_words(holder, pci)}: {reason}", lasting))
    if card.stowaway_bytes > 0:
        pids = " ".join(str(p) for p in sorted(card.stowaways)) or "PID"
        out.append(Cause("stowaway", f"{stowaway_words(card)}: a process outside Berth, which "
                                     f"Berth never stops; end it (kill {pids}) or run it "
                                     f"under `berth run`", True))
    if not out:
        out.append(Cause("reserve", f"the card's reserve of {format_size(card.reserve_bytes)} "
                                    f"stays free", True))
    return out

