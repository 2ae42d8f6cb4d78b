"""The restart hold (issue 12 case 2), pure: a lease whose host says its supervisor restarts the
process keeps its room when the process exits on its own, until the host attaches the new PID,
releases it for good, or the hold's time runs out. Virtual time, no I/O."""

from __future__ import annotations

from berth.decide.model import ShareState

from tests.decide.world import GiB, World, pci_of

S = ShareState
G0 = pci_of(0)


def held_world() -> World:
    """A 24 GiB card; ``a`` (11 GiB, a 20 s restart hold, a priority that keeps it from being
    displaced) serves, ``w`` (14 GiB) waits."""
    w = World([24 * GiB], reserve=GiB // 2)
    w.request("a", "A", {G0: 11 * GiB}, priority=10)
    w.s.ledger.leases["a"].restart_grace_s = 20.0
    w.apply(w.s.attach("a", 101, 1.0, w.now))
    w.request("w", "W", {G0: 14 * GiB})
    assert w.s.ledger.leases["w"].is_waiting()
    return w


def test_an_exit_keeps_the_room_and_the_new_pid_takes_it_on():
    w = held_world()
    w.exit("a")                       # SIGKILL; the driver frees the old memory later
    w.used.pop(("a", G0))
    w.read()
    w.advance(5.0)
    lease = w.s.ledger.leases["a"]
    assert lease.shares[G0].state is S.ACTIVE and lease.pid is None
    assert w.s.ledger.leases["w"].is_waiting()          # the room is not handed on
    w.apply(w.s.exited("a", w.now))                     # read again: old news
    w.apply(w.s.attach("a", 202, 9.0, w.now))
    assert lease.restarting_until is None and lease.pid == 202
    w.advance(30.0)
    assert lease.shares[G0].state is S.ACTIVE and w.s.ledger.leases["w"].is_waiting()
    w.check()


def test_a_restart_that_does_not_come_gives_the_room_up_at_the_bound():
    w = held_world()
    w.exit("a")
    w.advance(19.0)
    assert w.s.ledger.leases["w"].is_waiting()
    w.advance(2.0)                                      # 21 s > 20 s
    assert w.s.ledger.leases["a"].shares[G0].state is S.RELEASED
    assert any(getattr(e, "kind", None) == "restart.over" for e in w.effects)
    w.confirm_all()
    assert w.s.ledger.leases["w"].shares[G0].state is S.ACTIVE
    w.check()


def test_a_release_or_a_drain_is_final():
    w = held_world()
    w.exit("a")
    w.apply(w.s.exited("a", w.now, final=True))         # the host: FATAL, or stopped
    assert w.s.ledger.leases["a"].shares[G0].state is S.RELEASED
    w.confirm_all()
    assert w.s.ledger.leases["w"].shares[G0].state is S.ACTIVE
    w2 = held_world()
    w2.apply(w2.s.operator("drain", "a", w2.now))
    w2.exit("a")                    # the drain's stop: the process exits before the report
    assert w2.s.ledger.leases["a"].restarting_until is None
    w2.do_all()
    assert "a" not in w2.s.ledger.leases
    assert w2.s.ledger.leases["w"].shares[G0].state is S.ACTIVE
    w2.check()


def test_without_a_restart_grace_an_exit_releases_at_once():
    w = World([24 * GiB])
    w.request("a", "A", {G0: 11 * GiB})
    w.exit("a")
    assert w.s.ledger.leases["a"].shares[G0].state is S.RELEASED
