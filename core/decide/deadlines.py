"""Deadlines: what happens when a park, lend, wake, return or drain outlives its limit, and when
a restart hold runs out.

Source: seed 002 rule 4 ("every sleep has a way back and a fallback": ``release_grace`` turns a
park or lend into a drain, ``wake_limit`` stops a wake or return that does not answer), issue 12
case 2 (the restart hold). Pure: no I/O, no clock.
"""

from __future__ import annotations

from .actions import fallback
from .effects import Effect, Note
from .model import Op, ShareState
from .restarts import exited
from .rooms import admit
from .state import State, card_name

S = ShareState

__all__ = ["tick", "next_due"]


def tick(st: State, now: float) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.tick`."""
    fx: list[Effect] = []
    for (lid, pci, op), due in sorted(st.deadlines.items(), key=lambda kv: kv[1]):
        if due > now or (lid, pci, op) not in st.deadlines:
            continue
        del st.deadlines[(lid, pci, op)]
        fx += _overdue(st, lid, pci, op, now)
    for lease in [le for le in st.ledger.leases.values()
                  if le.restarting_until is not None and le.restarting_until <= now]:
        fx.append(Note(lease.id, "restart.over", f"{lease.engine}: not restarted within "
                                                 f"{lease.restart_grace_s:g}s; its room goes"))
        fx += exited(st, lease.id, now, final=True)
    for lid in [lid for lid, due in st.recheck.items() if due <= now]:
        del st.recheck[lid]        # the admission pass below plans for it again
    st.swaps.prune(now - st.policy.juggle_window_s)
    return fx + admit(st, now)


def next_due(st: State) -> float | None:
    """When :func:`tick` next has something to do: the earliest deadline or turn end."""
    return min([*st.deadlines.values(), *st.recheck.values()], default=None)


def _overdue(st: State, lid: str, pci: str, op: str, now: float) -> list[Effect]:
    """One deadline passed: a park or lend the driver did not confirm, or a wake or return
    that did not answer, falls back to a drain; a drain's memory not yet free is said."""
    lease = st.ledger.leases.get(lid)
    if lease is None:
        return []
    sh = lease.shares[pci]
    p = st.policy
    if op in (Op.PARK, Op.LEND) and sh.state in (S.PARKING, S.LENDING):
        return fallback(st, lease, now, f"{op} not confirmed by the driver within "
                                        f"release_grace ({p.release_grace_s:g}s)")
    if op in (Op.WAKE, Op.RETURN) and sh.state in (S.RESUMING, S.RETURNING):
        return fallback(st, lease, now, f"{op} did not answer within wake_limit "
                                        f"({p.wake_limit_s:g}s)")
    if op == Op.DRAIN and sh.state in (S.DRAINING, S.RELEASED):
        return [Note(lid, "drain.overdue", f"{lease.engine}: memory on {card_name(st, pci)} "
                     f"not free {p.release_grace_s:g}s after the drain; still watching",
                     {"card": pci})]
    return []
