"""Issue 25, live: engines that name no card are placed at grant time, inside berthd's single
writer, where they fit best, and nothing is displaced that need not be. A real berthd on two
simulated 24 GiB cards (1 GiB reserve each), real ``berth run`` processes, stub engines that
allocate on the cards their ``CUDA_VISIBLE_DEVICES`` names."""

from __future__ import annotations

from tests.helpers import wait_for
from tests.making_room.world import GiB, MiB

TWO = (("gpu0", "24GiB"), ("gpu1", "24GiB"))


def _start(lv, engine: str, size: str, weights_gib: int):
    lv.run(engine, ["--size", size], ["--weights", f"{weights_gib}GiB"])
    # Each request is taken before the next is made: the arrival order is the issue's.
    wait_for(lambda: lv.lease(engine), 20, f"{engine}'s request taken")


def test_best_fit_places_all_four_with_nothing_displaced(live):
    """X 16 GiB on gpu0 runs (no park: only a drain would move it); N 10 GiB, P 6 GiB and
    Q 12 GiB arrive naming no card. P goes on gpu0 beside X, N and Q on gpu1: all four serve,
    with no park and no drain (before issue 25, N and P went on the emptier gpu1 and X was
    drained for Q)."""
    lv = live(TWO)
    _start(lv, "X", "16GiB@gpu0", 15)
    lv.wait_serving("X")
    for engine, size in (("N", 10), ("P", 6), ("Q", 12)):
        _start(lv, engine, f"{size}GiB", size - 1)
    pids = {e: lv.wait_serving(e, 40)["pid"] for e in "XNPQ"}
    assert {e: lv.states(e) for e in "XNPQ"} == {
        "X": {"gpu0": "active"}, "N": {"gpu1": "active"}, "P": {"gpu0": "active"},
        "Q": {"gpu1": "active"}}
    # The engines allocated where the grant put them (CUDA_VISIBLE_DEVICES from the placement).
    ctx = 256 * MiB
    assert lv.card_use("gpu0") == {pids["X"]: 15 * GiB + ctx, pids["P"]: 5 * GiB + ctx}
    assert lv.card_use("gpu1") == {pids["N"]: 9 * GiB + ctx, pids["Q"]: 11 * GiB + ctx}
    c = lv.counters()
    assert c["drains"] == 0 and c["parks"] == 0 and c["checkpoints"] == 0, c
    assert lv.oom_events() == 0
    grant = lv.entry("P", "grant")
    assert "placed on gpu0: it fits there" in grant["text"] and "best fit" in grant["text"], grant


def test_any_two_cards_go_where_they_fit_now(live):
    """An engine that asks for any 2 cards (``--size 12GiB --size 12GiB``) on four, two of them
    held by engines that cannot park, is granted the two free ones, and its engine allocates
    there; nothing is drained."""
    lv = live((("gpu0", "24GiB"), ("gpu1", "24GiB"), ("gpu2", "24GiB"), ("gpu3", "24GiB")))
    _start(lv, "A", "16GiB@gpu0", 15)
    _start(lv, "B", "16GiB@gpu2", 15)
    lv.wait_serving("A")
    lv.wait_serving("B")
    lv.run("T", ["--size", "12GiB", "--size", "12GiB"], ["--weights", "11GiB"])
    t = lv.wait_serving("T", 40)
    assert lv.states("T") == {"gpu1": "active", "gpu3": "active"}
    ctx = 256 * MiB
    assert lv.card_use("gpu1") == {t["pid"]: 11 * GiB + ctx}
    assert lv.card_use("gpu3") == {t["pid"]: 11 * GiB + ctx}
    assert lv.counters()["drains"] == 0 and lv.oom_events() == 0
