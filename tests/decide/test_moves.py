"""The move rung, planned (``berth.decide.moves``; issue 35): which holders to move so that a
waiter fits with nothing parked or drained, priced by their measured costs, bounded, and never a
holder whose command pins its card."""

from __future__ import annotations

from berth.decide.model import Capabilities, Lease, ParkMechanism, Share, ShareState
from berth.decide.moves import move_block, plan_moves

from tests.decide.world import GiB, World, pci_of

G0, G1 = pci_of(0), pci_of(1)


def _hold(w: World, lid: str, card: str, size: int, *, cost_s: float = 5.0,
          pinned: str | None = None, named: bool = False, park=None,
          park_cost_s: float = 0.0) -> Lease:
    """A run's lease of ``size`` on ``card``, granted and active; placed by Berth (movable)
    unless ``named``."""
    lease = Lease(lid, lid, {card: Share(card, size)},
                  caps=Capabilities(front="127.0.0.1:1", pinned=pinned, park=park))
    w.apply(w.s.request(lease, w.now))
    assert lid in w.granted_order
    lease.movable = frozenset() if named else frozenset({card})
    lease.switch_cost_s, lease.park_cost_s = cost_s, park_cost_s
    return lease


def _two_cards(**c) -> World:
    """The issue's shape: two 24 GiB cards (1 GiB reserve); B 12 GiB on gpu0 (A 8 GiB left it),
    C 10 GiB on gpu1. A waiter of 20 GiB fits nowhere now."""
    w = World([24 * GiB, 24 * GiB], reserve=GiB)
    _hold(w, "B", G0, 12 * GiB, cost_s=c.get("b_cost", 6.0), pinned=c.get("b_pinned"))
    _hold(w, "C", G1, 10 * GiB, cost_s=c.get("c_cost", 4.0), pinned=c.get("c_pinned"),
          named=c.get("c_named", False))
    return w


def test_the_cheaper_holder_moves_beside_the_other_and_the_waiter_fits():
    w = _two_cards()
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now)
    assert p is not None and p.card == G1 and p.cost_s == 4.0
    [m] = p.moves
    assert (m.lease_id, m.src, m.dst, m.how) == ("C", G1, G0, "restart")
    assert m.takes_bytes == 10 * GiB <= w.s.ledger.available(G0, "C")
    assert w.s.ledger.available(G1, "W") + m.frees_bytes >= 20 * GiB
    assert "C gpu1→gpu0 (restart)" in p.why(w.s.ledger)
    # Dearer to restart C than B: B moves instead.
    p = plan_moves(_two_cards(c_cost=9.0).s.ledger, "W", 20 * GiB, [G0, G1], 0.0)
    assert [(m.lease_id, m.dst) for m in p.moves] == [("B", G1)]


def test_a_pinned_or_named_holder_never_moves_and_says_why():
    w = _two_cards(c_pinned="its command names a card (--main-gpu 1)")
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now)
    assert [m.lease_id for m in p.moves] == ["B"]
    assert move_block(w.s.ledger.leases["C"]) == \
        "never moved: its command names a card (--main-gpu 1)"
    assert move_block(w.s.ledger.leases["B"]) is None
    w = _two_cards(c_named=True, b_pinned="its command sets CUDA_VISIBLE_DEVICES=0")
    assert plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now) is None
    assert move_block(w.s.ledger.leases["C"]) == "never moved: its size names its card"


def test_nothing_moves_for_a_waiter_that_fits_or_whose_room_no_move_can_make():
    w = _two_cards()
    assert plan_moves(w.s.ledger, "W", 11 * GiB, [G0, G1], w.now) is None       # fits now
    assert plan_moves(w.s.ledger, "W", 24 * GiB, [G0, G1], w.now) is None       # never fits
    # A protected holder (a turn, a hold, a higher priority) stays where it is.
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now, protected=frozenset({"C"}))
    assert [m.lease_id for m in p.moves] == ["B"]


def test_a_checkpointing_holder_moves_by_restore_where_the_tool_restores_across_cards():
    w = World([24 * GiB, 24 * GiB], reserve=GiB)
    _hold(w, "B", G0, 12 * GiB, cost_s=1.5, park=ParkMechanism.CHECKPOINT, park_cost_s=1.0)
    _hold(w, "C", G1, 10 * GiB, cost_s=4.0)
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now, restore_across=True)
    assert [(m.lease_id, m.how, m.cost_s) for m in p.moves] == [("B", "restore", 2.5)]
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1], w.now, restore_across=False)
    assert [(m.lease_id, m.how) for m in p.moves] == [("B", "restart")]


def test_two_moves_when_one_is_not_enough():
    """Three cards: gpu0 holds D 6 GiB and E 6 GiB; gpu1 and gpu2 have 8 GiB free each. A
    20 GiB waiter needs both D and E off gpu0, one to each other card."""
    w = World([24 * GiB, 24 * GiB, 24 * GiB], reserve=GiB)
    g2 = pci_of(2)
    _hold(w, "D", G0, 6 * GiB)
    _hold(w, "E", G0, 6 * GiB)
    _hold(w, "F", G1, 15 * GiB, named=True)
    _hold(w, "G", g2, 15 * GiB, named=True)
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0], w.now)
    assert p is not None and sorted(m.lease_id for m in p.moves) == ["D", "E"]
    assert {m.dst for m in p.moves} == {G1, g2}


def test_the_scheduler_moves_a_holder_instead_of_draining_and_grants_the_waiter():
    """The issue's two-card shape in the scheduler: B and C busy (their turns keep their
    cards), W asks 20 GiB: C is moved (a drain whose run asks again at once), not drained, and
    W is granted where C was, by the move rung."""
    from berth.decide.admission import Policy
    from berth.decide.placement import Ask
    from berth.decide.scheduler import Granted, Instruct, Note

    w = World([24 * GiB, 24 * GiB], Policy(min_turn_s=60, juggle_window_s=0), reserve=GiB)
    for lid, card, size, cost in (("B", G0, 12 * GiB, 6.0), ("C", G1, 10 * GiB, 4.0)):
        _hold(w, lid, card, size, cost_s=cost)
        w.apply(w.s.ready(lid, w.now))
        w.apply(w.s.jobs(lid, 1, w.now))
    waiter = Lease("W", "W", {}, caps=Capabilities(front="127.0.0.1:2"))
    w.s.place(waiter, [Ask(None, 20 * GiB)], {})
    w.apply(w.s.request(waiter, w.now))
    [move] = [e for e in w.effects if isinstance(e, Instruct) and e.lease_id == "C"]
    assert move.move_to == G0 and "it moves to gpu0" in move.reason, move
    assert not [e for e in w.effects if isinstance(e, Instruct) and e.lease_id == "B"]
    c = w.s.counters
    assert (c.moves, c.drains, c.parks, c.checkpoints) == (1, 0, 0, 0)
    notes = [e.text for e in w.effects if isinstance(e, Note) and e.kind == "move"]
    assert len(notes) == 1 and notes[0].startswith("C moves gpu1→gpu0 (room for W"), notes
    w.exit("C")
    w.confirm_all()
    [grant] = [e for e in w.effects if isinstance(e, Granted) and e.lease_id == "W"]
    assert list(grant.cards) == [G1] and grant.rung == "move"


def test_no_waiter_no_move():
    w = _two_cards()
    w.advance(600.0)
    w.read()
    assert w.s.counters.moves == 0


def test_a_waiter_over_two_cards_gets_the_cheapest_two_cards_emptied():
    """Three 24 GiB cards: D 6 GiB on gpu0, E 6 GiB (dearer) on gpu1, gpu2 empty. A waiter of
    20 GiB on each of two cards: only D moves, beside E (never onto a card of the waiter's
    set), and the waiter takes gpu0 and gpu2."""
    w = World([24 * GiB, 24 * GiB, 24 * GiB], reserve=GiB)
    g2 = pci_of(2)
    _hold(w, "D", G0, 6 * GiB, cost_s=2.0)
    _hold(w, "E", G1, 6 * GiB, cost_s=8.0)
    p = plan_moves(w.s.ledger, "W", 20 * GiB, [G0, G1, g2], w.now, count=2)
    assert p is not None and set(p.cards) == {G0, g2}, p
    assert [(m.lease_id, m.dst) for m in p.moves] == [("D", G1)] and p.cost_s == 2.0


def _parked_for_w(restore_across: bool) -> World:
    """Two 24 GiB cards (1 GiB reserve): Y holds 14 GiB of gpu1 (by name), so X (10 GiB,
    checkpoint, placed by Berth) goes on gpu0, and is parked there for W (20 GiB on gpu0 by
    name: no move can make that room, X fits nowhere else). Then Y leaves."""
    from berth.decide.placement import Ask

    w = World([24 * GiB, 24 * GiB], reserve=GiB)
    w.request("Y", "Y", {G1: 14 * GiB})
    x = Lease("X", "X", {}, caps=Capabilities(park=ParkMechanism.CHECKPOINT,
                                              front="127.0.0.1:1",
                                              restore_across=restore_across))
    w.s.place(x, [Ask(None, 10 * GiB)], {})
    w.apply(w.s.request(x, w.now))
    assert list(x.shares) == [G0]
    w.request("W", "W", {G0: 20 * GiB})
    w.do_all()
    assert "W" in w.granted_order and x.states() == {ShareState.PARKED}, x.states()
    w.exit("Y")
    w.confirm_all()
    return w


def test_a_checkpoint_wakes_on_another_card_where_its_tool_restores_across_cards():
    """Issue 35: a parked engine of free placement whose tool restores onto another card
    (``--device-map``) wakes at once where it fits, the same lease, nothing else parked; with
    a tool that cannot, its wake waits for its own card."""
    from berth.decide.scheduler import Instruct, Note

    w = _parked_for_w(True)
    n = len(w.effects)
    w.apply(w.s.wake("X", w.now))
    [wake] = [e for e in w.effects[n:] if isinstance(e, Instruct) and e.op == "wake"]
    assert wake.lease_id == "X" and wake.cards == (G1,), wake
    [note] = [e for e in w.effects[n:] if isinstance(e, Note) and e.kind == "resume"]
    assert "restored onto gpu1" in note.text, note.text
    w.do_all()
    x = w.s.ledger.leases["X"]
    assert list(x.shares) == [G1] and x.states() == {ShareState.ACTIVE}
    assert w.s.counters.checkpoints == 1 and w.s.counters.drains == 0   # X's one park
    assert w.s.ledger.leases["W"].states() == {ShareState.ACTIVE}
    w.check()

    w = _parked_for_w(False)
    n = len(w.effects)
    w.apply(w.s.wake("X", w.now))
    assert not [e for e in w.effects[n:] if isinstance(e, Instruct) and e.op == "wake"]
    assert list(w.s.ledger.leases["X"].shares) == [G0]


def test_a_holder_whose_checkpoint_restores_across_cards_moves_by_park_and_restore():
    """The two-card shape with C parked by checkpoint and restored onto another card: the move
    is a park whose wake follows at once on gpu0, the same lease (no drain, no restart), and W
    is granted gpu1 by the move rung."""
    from berth.decide.admission import Policy
    from berth.decide.placement import Ask
    from berth.decide.scheduler import Granted, Instruct, Note

    w = World([24 * GiB, 24 * GiB], Policy(min_turn_s=60, juggle_window_s=0), reserve=GiB)
    for lid, card, size, cost in (("B", G0, 12 * GiB, 6.0), ("C", G1, 10 * GiB, 4.0)):
        lease = _hold(w, lid, card, size, cost_s=cost, park=ParkMechanism.CHECKPOINT,
                      park_cost_s=1.0)
        lease.caps = Capabilities(front="127.0.0.1:1", park=ParkMechanism.CHECKPOINT,
                                  restore_across=lid == "C")
        w.apply(w.s.ready(lid, w.now))
        w.apply(w.s.jobs(lid, 1, w.now))
    waiter = Lease("W", "W", {}, caps=Capabilities(front="127.0.0.1:2"))
    w.s.place(waiter, [Ask(None, 20 * GiB)], {})
    w.apply(w.s.request(waiter, w.now))
    [park] = [e for e in w.effects if isinstance(e, Instruct) and e.lease_id == "C"]
    assert park.op == "park" and "by checkpoint and restore" in park.reason, park
    notes = [e.text for e in w.effects if isinstance(e, Note) and e.kind == "move"]
    assert notes == ["C moves gpu1→gpu0 by checkpoint and restore (room for W)"], notes
    w.apply(w.s.jobs("C", 0, w.now))
    w.do_all()
    [grant] = [e for e in w.effects if isinstance(e, Granted) and e.lease_id == "W"]
    assert list(grant.cards) == [G1] and grant.rung == "move"
    [wake] = [e for e in w.effects if isinstance(e, Instruct) and e.lease_id == "C"
              and e.op == "wake"]
    assert wake.cards == (G0,)
    c = w.s.ledger.leases["C"]
    assert list(c.shares) == [G0] and c.states() == {ShareState.ACTIVE}
    assert (w.s.counters.moves, w.s.counters.drains) == (1, 0)
    w.check()
