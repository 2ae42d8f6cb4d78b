"""The suggested reserve: growth the reserve has to absorb, bounded by the card.

The demo's 12 GiB card was once told to keep a 13.9 GiB reserve: every load and every growth
inside a lease counted as a "step" between reads, though admission had already counted those
bytes (a share counts its whole reservation). What eats into the reserve is growth no admission
counted: use past the reservation. Driven through the scheduler with driver reads, as berthd
does."""

from __future__ import annotations

from berth.decide.admission import Policy
from berth.decide.measures import suggested_reserve
from berth.decide.model import Bound

from .world import GiB, MiB, World, pci_of

PCI = pci_of(0)
READ_S = 0.25


def _world() -> World:
    w = World([12 * GiB], policy=Policy(min_turn_s=0, juggle_window_s=0,
                                        read_interval_s=READ_S), reserve=1 * GiB)
    w.request("a", "llm", {PCI: 6 * GiB})
    assert w.s.ledger.leases["a"].shares[PCI].state.value == "active"
    return w


def _reads(w: World, uses: list[int], lid: str = "a") -> None:
    for u in uses:
        w.now += READ_S
        w.used[(lid, PCI)] = u
        w.read()


def _suggested(w: World) -> dict:
    return suggested_reserve(w.s.ledger, w.s.growth, READ_S)[PCI]


def test_growth_inside_the_lease_suggests_nothing():
    """A load in steps and a KV cache growing, all inside the 6 GiB lease: admission counted
    them already, so the configured 1 GiB reserve is not below the suggestion."""
    w = _world()
    w.advance(5.0)                                       # serving for a while
    _reads(w, [1 * GiB, 3 * GiB, 5 * GiB, 5 * GiB + 512 * MiB, 6 * GiB])
    s = _suggested(w)
    assert s["suggested_bytes"] == 0, s
    assert not s["below"]


def test_an_extension_then_its_load_is_no_step():
    """The reservation grows first (an extension is an admission), then the use: nothing the
    reserve has to absorb."""
    w = World([12 * GiB], policy=Policy(min_turn_s=0, juggle_window_s=0,
                                        read_interval_s=READ_S), reserve=1 * GiB)
    w.request("b", "comfyui", {PCI: 10 * GiB}, bound=Bound.GROWTH, need={PCI: 6 * GiB})
    assert w.s.ledger.leases["b"].shares[PCI].reserved_bytes == 6 * GiB
    w.advance(5.0)
    _reads(w, [6 * GiB], "b")
    w.apply(w.s.extend("b", PCI, 4 * GiB, w.now))
    assert w.s.ledger.leases["b"].shares[PCI].reserved_bytes == 10 * GiB
    _reads(w, [8 * GiB, 10 * GiB], "b")
    assert _suggested(w)["suggested_bytes"] == 0


def test_growth_past_the_lease_is_suggested_bounded_by_the_card_and_forgotten_with_it():
    w = _world()
    w.advance(5.0)
    _reads(w, [6 * GiB, 6 * GiB + 512 * MiB])            # 512 MiB past the lease in one read
    s = _suggested(w)
    assert 512 * MiB <= s["suggested_bytes"] < 12 * GiB, s
    assert not s["below"]                                # 1 GiB still covers it
    _reads(w, [9 * GiB, 11 * GiB])                        # an engine far over its lease
    s = _suggested(w)
    card = w.s.ledger.cards[PCI]
    assert s["below"], s
    assert s["suggested_bytes"] <= card.total_bytes - card.baseline_bytes, s
    w.exit("a")                                          # the overrunning holder is gone
    w.confirm_all()
    assert "a" not in w.s.ledger.leases
    assert _suggested(w)["suggested_bytes"] == 0
