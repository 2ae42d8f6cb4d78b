"""A request for room withdrawn (issue 28): once its prompt stops waiting, the ladder never makes
room for it later. Seen against a real ComfyUI: a prompt got a 503 while a busy LLM kept its
minimum turn, the request stayed queued, and when the LLM went idle berthd parked it for a
ComfyUI that no longer wanted the room."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.effects import Note
from berth.decide.model import Bound, ParkMechanism, ShareState

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)
S = ShareState


def _busy_llm_and_comfyui_asking() -> World:
    w = World([24 * GiB], Policy(min_turn_s=30, juggle_window_s=0), reserve=1 * GiB)
    w.request("llm", "LLM", {G0: 14 * GiB}, park=ParkMechanism.CHECKPOINT)
    w.request("c", "comfyui", {G0: 20 * GiB}, bound=Bound.GROWTH, need={G0: 0}, growth=1 * GiB,
              park=ParkMechanism.HOOK)
    w.apply(w.s.ready("llm", w.now))
    w.apply(w.s.jobs("llm", 1, w.now))                   # a chat runs: its turn protects it
    w.apply(w.s.extend("c", G0, 10 * GiB, w.now))
    assert "c" in w.s.queue and w.s.ledger.leases["llm"].shares[G0].state is S.ACTIVE
    return w


def test_a_withdrawn_request_leaves_the_queue_and_parks_nobody_later():
    w = _busy_llm_and_comfyui_asking()
    w.advance(3)
    w.apply(w.s.unextend("c", w.now, "its prompt got a 503"))
    assert "c" not in w.s.queue
    notes = [e for e in w.effects if isinstance(e, Note) and e.kind == "extend.off"]
    assert notes and "its prompt got a 503" in notes[0].text
    w.advance(1)
    w.apply(w.s.jobs("llm", 0, w.now))                  # the LLM goes idle
    w.do_all()
    assert w.s.ledger.leases["llm"].shares[G0].state is S.ACTIVE
    assert w.s.ledger.leases["c"].shares[G0].reserved_bytes == 1 * GiB
    assert not w.pending


def test_without_the_withdraw_the_idle_llm_is_parked_for_the_stale_request():
    """The shape the withdraw prevents, kept as a check that the test above can fail."""
    w = _busy_llm_and_comfyui_asking()
    w.advance(4)
    w.apply(w.s.jobs("llm", 0, w.now))
    assert w.s.ledger.leases["llm"].shares[G0].state is S.PARKING


def test_withdrawing_nothing_changes_nothing():
    w = _busy_llm_and_comfyui_asking()
    w.apply(w.s.unextend("c", w.now))
    assert w.s.unextend("c", w.now) == []               # already gone
    assert w.s.unextend("llm", w.now) == []             # never asked
