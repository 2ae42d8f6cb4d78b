"""Stage C live (seed 002 "Order of work", #189): "Maya on five cards lends from one card while
the other four serve".

Five simulated 24 GiB cards (1 GiB reserve each). Maya leases 20 GiB on each through one
``berth run`` (``--size 20GiB@gpu0 … --size 20GiB@gpu4``); its stub engine sees the five cards in
``CUDA_VISIBLE_DEVICES`` and holds the same profile on each (256 MiB context, 11 GiB weights,
8.75 GiB KV pool). An image engine then asks for 8 GiB on gpu3 only: Maya lends 8 GiB there, and
nowhere else.
"""

from __future__ import annotations

from tests.helpers import wait_for
from tests.making_room.world import GiB, MiB, served

CARDS = [f"gpu{i}" for i in range(5)]
MAYA_RUN = [a for c in CARDS for a in ("--size", f"20GiB@{c}")] + [
    "--lend", "--lend-max", "8GiB", "--park", "hook", "--adapter", "protocol"]
MAYA_ENGINE = ["--weights", "11GiB", "--kv-pool", "8.75GiB", "--protocol", "--lend"]
PER_CARD = 20 * GiB                # 256 MiB + 11 GiB + 8.75 GiB on each card


def test_a_five_card_lease_lends_from_one_card_while_the_other_four_serve(live):
    lv = live(cards=[(c, "24GiB") for c in CARDS], min_turn="0s", release_grace="5s")
    maya = lv.run("Maya", MAYA_RUN, MAYA_ENGINE)
    ml = lv.wait_serving("Maya")
    assert sorted(sh["card_name"] for sh in ml["shares"]) == CARDS
    wait_for(lambda: all(lv.card_use(c).get(ml["pid"]) == PER_CARD for c in CARDS), 60,
             "Maya loaded on all five cards")
    served(maya.front)

    img = lv.run("img", ["--size", "8GiB@gpu3"], ["--weights", "7GiB"])
    il = lv.wait_serving("img")
    assert [sh["card_name"] for sh in il["shares"]] == ["gpu3"]

    # 4 active + 1 lent: the lend is on gpu3 only, to the image engine.
    assert lv.states("Maya") == {"gpu0": "active", "gpu1": "active", "gpu2": "active",
                                 "gpu3": "lent", "gpu4": "active"}
    shares = {sh["card_name"]: sh for sh in lv.lease("Maya")["shares"]}
    assert shares["gpu3"]["lent_bytes"] == 8 * GiB and shares["gpu3"]["lent_to"] == il["id"]
    assert all(shares[c]["lent_bytes"] == 0 for c in CARDS if c != "gpu3")
    assert il["shares"][0]["borrowed_from"] == ml["id"]
    c = lv.counters()
    assert (c["lends"], c["parks"], c["drains"], c["fallbacks_to_drain"]) == (1, 0, 0, 0), c
    grant = lv.entry("img", "grant")
    assert grant["data"]["rung"] == "lend" and grant["seq"] > lv.entry("Maya", "lent")["seq"]
    # The driver agrees: Maya gave 8 GiB back on gpu3 and nothing elsewhere.
    for card in CARDS:
        use = lv.card_use(card)
        if card == "gpu3":
            assert use == {ml["pid"]: PER_CARD - 8 * GiB, il["pid"]: 256 * MiB + 7 * GiB}, use
        else:
            assert use == {ml["pid"]: PER_CARD}, (card, use)

    # Maya serves during the lend, through its front, and so does the borrower.
    for _ in range(2):
        served(maya.front)
        served(img.front)
    assert lv.states("Maya")["gpu3"] == "lent"

    # The borrower leaves; gpu3 grows back after the driver read, and all five are active.
    assert img.stop() == 0
    wait_for(lambda: lv.serving("Maya") and lv.counters()["returns"] == 1, 60,
             "Maya grown back")
    assert lv.entry("img", "freed")["seq"] < lv.entry("Maya", "returning")["seq"]
    wait_for(lambda: all(lv.card_use(c) == {ml["pid"]: PER_CARD} for c in CARDS), 30,
             "Maya holds its pool on all five cards again")
    served(maya.front)
    assert lv.oom_events() == 0
    assert maya.stop() == 0
