"""Exits and restarts: what a holder's exit does (with the restart hold of a process its
supervisor restarts), and how a lease taken back from the state file is settled by its measured
use and re-arms what it waits for.

Source: seed 002 rules 4 (fall back to a drain) and 5 (the state file survives a restart),
issue 4, issue 12 case 2. Pure: no I/O, no clock.
"""

from __future__ import annotations

from .actions import ending_fields, want_return
from .admission import Waiter, WaitKind
from .effects import Effect, Ended, Instruct, Note, Until, Watch
from .ledger import RESIDUAL_SLACK_BYTES as SLACK
from .model import LIVE_STATES, Lease, Op, ShareState
from .rooms import admit, cancel_room, withdraw
from .state import State, card_name, drop, residual_limit

S = ShareState

__all__ = ["exited", "adopt", "settle"]


def exited(st: State, lease_id: str, now: float, final: bool = False) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.exited`."""
    lease = st.ledger.leases.get(lease_id)
    if lease is None:
        return []
    if lease.is_waiting():
        return withdraw(st, lease_id, now, "process exited while waiting")
    if not final and lease.restart_grace_s > 0 and lease.states() == {S.ACTIVE} \
            and not any(key[0] == lease_id for key in st.deadlines):
        return _hold_for_restart(lease, now)
    lease.restarting_until = None
    fx = cancel_room(st, lease_id, now)
    st.queue.remove(lease_id)
    st.wake_wanted.discard(lease_id)
    lease.in_flight, lease.busy_since = 0, None
    moved = False
    for pci, sh in lease.shares.items():
        if sh.state is S.WAITING:
            st.ledger.move(lease_id, pci, S.FREED, now)
        elif sh.state in LIVE_STATES:
            for op in Op:
                st.deadlines.pop((lease_id, pci, op), None)
            st.ledger.move(lease_id, pci, S.RELEASED, now, **ending_fields(sh))
            fx.append(Watch(lease_id, pci, Until.FREED, 0, now,
                            now + st.policy.release_grace_s))
            moved = True
    if moved:
        # One exit is news once: the run's drain report, its release and the reader's
        # sight of the dead process all come here (issue 12 case 7). An in-process host's
        # process may run on (its drain stops only its work): never say it exited.
        fx.append(Note(lease_id, "exit", f"{lease.engine} exited" if lease.caps.drain else
                       f"{lease.engine}'s lease ends (an in-process host, which Berth never "
                       f"stops; its memory counts until a driver read shows it free)"))
    if lease.is_over():
        drop(st, lease_id)
        fx.append(Ended(lease_id, "exited"))
    return fx + admit(st, now)


def _hold_for_restart(lease: Lease, now: float) -> list[Effect]:
    """Keep the room of a lease whose supervisor restarts its process (issue 12 case 2)."""
    if lease.restarting_until is not None:
        return []                    # the hold runs; the dead PID is old news
    lease.restarting_until = now + lease.restart_grace_s
    pid, lease.pid, lease.start_time = lease.pid, None, None
    return [Note(lease.id, "restart", f"{lease.engine}: pid {pid} exited; its room is "
                                      f"kept up to {lease.restart_grace_s:g}s while its "
                                      f"supervisor restarts it")]


def adopt(st: State, lease: Lease, now: float, waiting: str | None,
          since: float | None, use: dict[str, int | None]) -> list[Effect]:
    """See :meth:`~.scheduler.Scheduler.adopt`."""
    st.ledger.add_lease(lease)
    for pci in lease.shares:
        settle(st, lease, pci, use.get(pci), now)
    fx = _rearm(st, lease, now)
    if waiting is not None and lease.id not in st.queue:
        st.queue.push(Waiter(lease.id, WaitKind(waiting), lease.priority,
                             now if since is None else since, {}))
    fx += want_return(st, lease, now)
    fx.append(Note(lease.id, "reattach", f"{lease.engine} re-attached: "
                   + ", ".join(f"{card_name(st, pci)} {sh.state}"
                               for pci, sh in lease.shares.items())))
    return fx


def _rearm(st: State, lease: Lease, now: float) -> list[Effect]:
    """What each transitional state of an adopted lease waits for, asked again: its deadline
    restarts, a released share is watched until free, and the instruction is sent again."""
    p = st.policy
    waits = {S.RESUMING: (Op.WAKE, p.wake_limit_s), S.RETURNING: (Op.RETURN, p.wake_limit_s),
             S.PARKING: (Op.PARK, p.release_grace_s), S.LENDING: (Op.LEND, p.release_grace_s),
             S.DRAINING: (Op.DRAIN, p.release_grace_s),
             S.RELEASED: (Op.DRAIN, p.release_grace_s)}
    fx: list[Effect] = []
    for pci, sh in lease.shares.items():
        if sh.state in waits:
            op, limit_s = waits[sh.state]
            st.deadlines[(lease.id, pci, op)] = now + limit_s
        if sh.state is S.RELEASED:
            fx.append(Watch(lease.id, pci, Until.FREED, 0, now, now + p.release_grace_s))
    for op, state in ((Op.WAKE, S.RESUMING), (Op.RETURN, S.RETURNING), (Op.DRAIN, S.DRAINING),
                      (Op.PARK, S.PARKING), (Op.LEND, S.LENDING)):
        cards = tuple(pci for pci, sh in lease.shares.items() if sh.state is state)
        if cards:
            n = {pci: lease.shares[pci].lent_bytes for pci in cards} \
                if op in (Op.LEND, Op.RETURN) else {}
            fx.append(Instruct(lease.id, op, cards, st.next_seq(), n,
                               reason="re-attached after a restart"))
    return fx


def settle(st: State, lease: Lease, pci: str, use: int | None, now: float) -> None:
    """Settle one share of an adopted lease caught mid-transition by a restart, by its measured
    use (bytes; ``None``: the driver cannot say). Every move goes through the ledger."""
    sh = lease.shares[pci]
    led = st.ledger
    if sh.state is S.PARKING:
        # A use above the residual may be a park still under way (a checkpoint copying, a
        # free the driver has not shown yet): settled active, the park landing later would
        # leave berthd counting an engine awake whose front sleeps, and its requests hang.
        # It stays parking and the park is asked again (`_rearm`): the run answers "parked
        # already" or parks, and the driver's read confirms it (issue 18).
        if use is not None and use <= residual_limit(st, lease, pci):
            led.move(lease.id, pci, S.PARKED, now, residual_bytes=use)
        elif use is None:
            led.move(lease.id, pci, S.ACTIVE, now)
    elif sh.state is S.LENDING:
        if use is not None and use <= sh.reserved_bytes - sh.lent_bytes:
            led.move(lease.id, pci, S.LENT, now)
        else:
            led.move(lease.id, pci, S.ACTIVE, now, lent_bytes=0)
    elif sh.state is S.RESUMING:
        if use is not None and use > sh.residual_bytes + SLACK:
            led.move(lease.id, pci, S.ACTIVE, now)
    elif sh.state is S.RETURNING:
        # The run may have died with berthd before it read its return instruction: only a
        # use that shows the growth settles it; else the return is asked again (issue 18).
        # A share with no N recorded (a state file of an older berthd) has nothing to ask.
        if sh.lent_bytes == 0 or (
                use is not None and use > sh.reserved_bytes - sh.lent_bytes + SLACK):
            led.move(lease.id, pci, S.ACTIVE, now, lent_bytes=0)
    if use is not None:
        led.update(lease.id, pci, used_bytes=use)
