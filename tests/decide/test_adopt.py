"""Settling shares caught mid-transition by a restart is the scheduler's decision
(``Scheduler.adopt`` with the measured use; issue 4 "State that survives", issue 11)."""

import pytest
from berth.decide.admission import Policy
from berth.decide.effects import Instruct
from berth.decide.ledger import RESIDUAL_SLACK_BYTES, max_residual
from berth.decide.model import Capabilities, Card, Lease, Op, ParkMechanism, Share, ShareState
from berth.decide.scheduler import Scheduler

S = ShareState
GIB, MIB = 1 << 30, 1 << 20
PCI = "0000:01:00.0"


def adopt(state, use, park=ParkMechanism.HOOK, **share):
    sched = Scheduler(Policy())
    sched.ledger.add_card(Card(PCI, "gpu0", 80 * GIB))
    sh = Share(PCI, 20 * GIB, state=state, reserved_bytes=20 * GIB, **share)
    lease = Lease("a", "eng", {PCI: sh}, caps=Capabilities(park=park, lend=True, front="x"),
                  pid=1, start_time=1.0)
    fx = sched.adopt(lease, 10.0, use={PCI: use})
    return sched, sched.ledger.leases["a"].shares[PCI], fx


@pytest.mark.parametrize("park, use, want", [
    (ParkMechanism.HOOK, 1 * GIB, S.PARKED),          # within the hook's expected residual
    (ParkMechanism.HOOK, 15 * GIB, S.PARKING),        # not left yet: the park is asked again
    (ParkMechanism.HOOK, None, S.ACTIVE),             # the driver cannot say: not parked
    (ParkMechanism.CHECKPOINT, 32 * MIB, S.PARKED),   # within the slack
    (ParkMechanism.CHECKPOINT, 1 * GIB, S.PARKING),   # a checkpoint leaves (almost) nothing
])
def test_parking_settles_by_the_one_residual_rule(park, use, want):
    sched, sh, fx = adopt(S.PARKING, use, park)
    assert sh.state is want
    if want is S.PARKED:
        assert sh.residual_bytes == use
    assert sched.ledger.check() is None


def test_a_park_the_driver_does_not_show_yet_stays_parking_and_is_asked_again():
    """berthd died inside a checkpoint and came back before the memory left the card (CI
    under load, issue 18): settled active, the park that lands next left berthd counting an
    awake engine whose front sleeps, and the next request hung 60 s. It stays parking, the
    park is asked again with its deadline, and the driver's read settles it."""
    sched, sh, fx = adopt(S.PARKING, 14 * GIB, ParkMechanism.CHECKPOINT)
    assert sh.state is S.PARKING and sh.reserved_bytes == 20 * GIB
    [ins] = [e for e in fx if isinstance(e, Instruct)]
    assert (ins.op, ins.cards) == (Op.PARK, (PCI,))
    assert ("a", PCI, Op.PARK) in sched.deadlines


def test_the_residual_rule_is_the_ledgers():
    lease = Lease("a", "e", {PCI: Share(PCI, 20 * GIB, S.ACTIVE, reserved_bytes=20 * GIB)},
                  caps=Capabilities(park=ParkMechanism.HOOK))
    assert max_residual(lease, PCI, 2 * GIB) == 2 * GIB
    assert max_residual(lease, PCI, 1 * MIB) == RESIDUAL_SLACK_BYTES
    lease.caps = Capabilities(park=ParkMechanism.CHECKPOINT)
    assert max_residual(lease, PCI, 2 * GIB) == RESIDUAL_SLACK_BYTES


@pytest.mark.parametrize("use, want, lent", [(12 * GIB, S.LENT, 8 * GIB),
                                             (19 * GIB, S.ACTIVE, 0)])
def test_lending_settles_by_what_left_the_holder(use, want, lent):
    _, sh, _ = adopt(S.LENDING, use, lent_bytes=8 * GIB)
    assert (sh.state, sh.lent_bytes) == (want, lent)


def test_resuming_is_active_once_the_memory_is_back_else_the_wake_is_asked_again():
    _, sh, fx = adopt(S.RESUMING, 18 * GIB, residual_bytes=1 * GIB)
    assert sh.state is S.ACTIVE and sh.used_bytes == 18 * GIB
    _, sh, fx = adopt(S.RESUMING, 1 * GIB + RESIDUAL_SLACK_BYTES, residual_bytes=1 * GIB)
    assert sh.state is S.RESUMING
    assert [e.op for e in fx if isinstance(e, Instruct)] == [Op.WAKE]


def test_returning_is_active_once_the_holder_grew_back():
    _, sh, fx = adopt(S.RETURNING, 20 * GIB, lent_bytes=8 * GIB)
    assert (sh.state, sh.lent_bytes, sh.used_bytes) == (S.ACTIVE, 0, 20 * GIB)
    assert not [e for e in fx if isinstance(e, Instruct)]


@pytest.mark.parametrize("use", [12 * GIB, 12 * GIB + RESIDUAL_SLACK_BYTES, None])
def test_returning_that_did_not_grow_is_asked_again_for_what_was_lent(use):
    """berthd died before the run read its return instruction (issue 18): the holder still
    uses what it kept (20 GiB reserved, 8 GiB lent). Settled active, it would stay shrunk by
    the lend for good; it stays returning and the return of 8 GiB is asked again."""
    sched, sh, fx = adopt(S.RETURNING, use, lent_bytes=8 * GIB)
    assert sh.state is S.RETURNING and sh.lent_bytes == 8 * GIB
    [ins] = [e for e in fx if isinstance(e, Instruct)]
    assert (ins.op, ins.cards, ins.bytes) == (Op.RETURN, (PCI,), {PCI: 8 * GIB})
    assert (sched.ledger.leases["a"].id, PCI, Op.RETURN) in sched.deadlines
    # The run grows back and says so: active, nothing lent any more.
    sched.report("a", "return", True, 11.0)
    assert (sh.state, sh.lent_bytes) == (S.ACTIVE, 0)
    assert sched.ledger.check() is None


def test_returning_from_an_older_state_file_with_no_n_is_active():
    _, sh, fx = adopt(S.RETURNING, None)
    assert sh.state is S.ACTIVE
    assert not [e for e in fx if isinstance(e, Instruct)]
