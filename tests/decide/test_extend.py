"""An extension asked for before the growth (issue 13: ComfyUI before a prompt whose model
files pass its reservation): the ladder makes room first, then the reservation grows."""

from __future__ import annotations

import pytest
from berth.decide.effects import Note
from berth.decide.model import Bound, Capabilities, Lease, ParkMechanism, Share, ShareState

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)
S = ShareState


def _world() -> World:
    w = World([24 * GiB], reserve=1 * GiB)
    w.request("llm", "LLM", {G0: 14 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.request("c", "comfyui", {G0: 20 * GiB}, bound=Bound.GROWTH, need={G0: 0}, growth=1 * GiB,
              park=ParkMechanism.HOOK)
    assert w.s.ledger.leases["c"].shares[G0].reserved_bytes == 1 * GiB
    return w


def test_an_extension_that_does_not_fit_parks_the_holder_beside_it_first():
    w = _world()
    w.apply(w.s.extend("c", G0, 10 * GiB, w.now))
    sh = w.s.ledger.leases["c"].shares[G0]
    assert sh.reserved_bytes == 1 * GiB                       # not yet: no room
    assert [p.op for p in w.pending] == ["park"] and w.pending[0].lease_id == "llm"
    w.do_all()
    assert w.s.ledger.leases["llm"].shares[G0].state is S.PARKED
    assert sh.reserved_bytes == 11 * GiB
    kinds = [e.kind for e in w.effects if isinstance(e, Note)]
    assert kinds.index("parked") < kinds.index("extend")
    w.used[("c", G0)] = 11 * GiB                              # the prompt loads: no OOM
    w.read()
    w.check()


def test_an_extension_that_fits_is_granted_at_once_and_never_past_the_size():
    w = World([24 * GiB], reserve=1 * GiB)
    w.request("c", "comfyui", {G0: 20 * GiB}, bound=Bound.GROWTH, need={G0: 0}, growth=1 * GiB)
    w.apply(w.s.extend("c", G0, 30 * GiB, w.now))
    assert w.s.ledger.leases["c"].shares[G0].reserved_bytes == 20 * GiB
    assert w.s.extend("c", G0, 1 * GiB, w.now) == []          # at its size: nothing to ask


def test_only_an_active_share_extends():
    w = _world()
    w.apply(w.s.operator("park", "c", w.now))
    with pytest.raises(ValueError, match="only an active share extends"):
        w.s.extend("c", G0, 1 * GiB, w.now)
    with pytest.raises(KeyError):
        w.s.extend("c", pci_of(3), 1 * GiB, w.now)


@pytest.mark.parametrize("client, parks", [("client-me", True), (None, False)])
def test_the_holder_whose_client_asks_for_room_yields_at_once(client, parks):
    """Issue 34: a request for room names its client as a wake does. The LLM's last answer
    went to the very client whose prompt now needs the room, so the LLM yields at once, though
    its gaps forecast a request within a switch back and its minimum turn runs. Failed before:
    the extension carried no client, and the LLM kept the card up to the rent (the demo's
    first switch)."""
    w = _world()
    w.apply(w.s.jobs("llm", 1, w.now, w.now, client="client-me"))
    w.advance(0.05)
    w.apply(w.s.jobs("llm", 0, w.now, answered_client="client-me", answered_at=w.now))
    llm = w.s.ledger.leases["llm"]
    llm.demand.gaps.extend([1.0, 1.2, 0.8])     # it is asked again within a switch back
    llm.switch_cost_s = llm.park_cost_s = 2.0   # measured: a switch back costs 4 s
    w.advance(0.2)
    w.apply(w.s.extend("c", G0, 10 * GiB, w.now, client, w.now))
    assert ([p.op for p in w.pending if p.lease_id == "llm"] == ["park"]) is parks, w.pending


def _highvram_comfyui_grown_by_a_read() -> World:
    """ComfyUI under ``--highvram`` (no park, never stopped) leased at its need of nothing plus
    the 1 GiB allowance; a prompt that slipped past its gate while it opened loaded 11.1 GiB,
    so a driver read extended the lease on berthd's side to 12.1 GiB, behind the node's back
    (its copy stays at 1 GiB); then an LLM of 8 GiB was granted beside it."""
    w = World([24 * GiB], reserve=1 * GiB)
    caps = Capabilities(park=None, drain=False, no_park="--highvram: unloading frees nothing")
    w.apply(w.s.request(Lease("c", "comfyui", {G0: Share(G0, 20 * GiB)}, caps=caps,
                              bound=Bound.GROWTH, need_bytes={G0: 0},
                              growth_allowance_bytes=1 * GiB), w.now))
    w.used[("c", G0)] = int(11.1 * GiB)
    w.read()
    c = w.s.ledger.leases["c"].shares[G0]
    assert c.reserved_bytes == int(12.1 * GiB), c
    w.request("llm", "LLM", {G0: 8 * GiB}, park=ParkMechanism.CHECKPOINT)
    assert w.s.ledger.leases["llm"].shares[G0].state is S.ACTIVE
    return w


def test_an_extension_asked_from_a_stale_reservation_parks_nobody():
    """The flake of tests/hosts/comfyui/test_unfreeable.py (a CI run at load 17, and again at
    load 13 here): the second prompt needs 11.3 GiB; the node, reckoning from its copy of 1 GiB,
    asked for 10.3 GiB more, berthd queued 7.9 GiB (up to the size) on top of the 12.1 GiB it
    had already extended to, and the ladder checkpointed the LLM for room ComfyUI already held.
    Asked with the total it needs (``to_bytes``), berthd asks only what its reservation lacks:
    nothing here. Failed before: ``extend`` took no total, and the LLM was parked."""
    w = _highvram_comfyui_grown_by_a_read()
    fx = w.s.extend("c", G0, int(10.3 * GiB), w.now, to_bytes=int(11.3 * GiB))
    w.apply(fx)
    assert fx == [] and "c" not in w.s.queue, fx
    assert w.pending == [] and w.s.counters.checkpoints == w.s.counters.parks == 0
    assert w.s.ledger.leases["llm"].shares[G0].state is S.ACTIVE
    assert w.s.ledger.leases["c"].shares[G0].reserved_bytes == int(12.1 * GiB)


def test_an_extension_by_its_total_asks_only_what_the_reservation_lacks():
    """A total past the reservation asks the difference (never more than ``bytes``, nor past
    the size), and the ladder makes room for that only."""
    w = _highvram_comfyui_grown_by_a_read()
    w.apply(w.s.extend("c", G0, int(10.3 * GiB), w.now, to_bytes=int(12.6 * GiB)))
    c = w.s.ledger.leases["c"].shares[G0]
    assert c.reserved_bytes == int(12.6 * GiB) and w.pending == []    # 0.5 GiB fits beside
    w.apply(w.s.extend("c", G0, 1 * GiB, w.now, to_bytes=30 * GiB))
    assert c.reserved_bytes == int(13.6 * GiB)                         # at most ``bytes``
