"""Stage A2 live (seed 002 "Order of work"; DESIGN.md "The Berth engine protocol"): a sized
borrower runs beside a lending holder, and the return waits for the driver.

One simulated 24 GiB card (1 GiB reserve, so 23 GiB to lease). The holder H leases 20 GiB and
uses all of it: a 256 MiB context, 11 GiB of weights and an 8.75 GiB KV pool, which it can lend
from (``--lend --lend-max 8GiB``; it could park too). The borrower B asks for 8 GiB and runs a
7 GiB engine. 20 + 8 > 23, so room must be made: the ladder lends before it parks.
"""

from __future__ import annotations

from tests.helpers import wait_for
from tests.making_room.world import GiB, MiB, served

HOLDER_RUN = ["--size", "20GiB", "--lend", "--lend-max", "8GiB", "--park", "hook",
              "--adapter", "protocol"]
HOLDER_ENGINE = ["--weights", "11GiB", "--kv-pool", "8.75GiB", "--protocol", "--lend"]
HOLDER_USE = 20 * GiB          # 256 MiB + 11 GiB + 8.75 GiB: exactly its lease


def test_a_borrower_runs_beside_a_lending_holder_and_the_return_waits_for_the_driver(live):
    lv = live(min_turn="0s", release_grace="5s")      # min_turn 0: H may make room at once
    h = lv.run("H", HOLDER_RUN, HOLDER_ENGINE)
    hl = lv.wait_serving("H")
    wait_for(lambda: lv.card_use("gpu0").get(hl["pid"]) == HOLDER_USE, 60, "H loaded")
    served(h.front)

    b = lv.run("B", ["--size", "8GiB"], ["--weights", "7GiB"])
    bl = lv.wait_serving("B")

    # H lent exactly the borrower's reservation, by the lend rung, not a park.
    hl = lv.lease("H")
    hs = hl["shares"][0]
    assert hs["state"] == "lent" and hs["lent_bytes"] == 8 * GiB, hs
    assert hs["lent_to"] == bl["id"] and bl["shares"][0]["borrowed_from"] == hl["id"]
    c = lv.counters()
    assert (c["lends"], c["parks"], c["drains"], c["fallbacks_to_drain"]) == (1, 0, 0, 0), c
    plan = lv.entry("B", "plan")
    assert plan["data"]["rung"] == "lend" and plan["data"]["steps"] == [["lend", "H"]], plan
    # The borrower was granted only after the driver read confirmed the lend.
    lend, lent, grant = lv.entry("H", "lend"), lv.entry("H", "lent"), lv.entry("B", "grant")
    assert lend["seq"] < lent["seq"] < grant["seq"] and grant["data"]["rung"] == "lend"
    use = lv.card_use("gpu0")
    assert use[hl["pid"]] == HOLDER_USE - 8 * GiB and use[bl["pid"]] == 256 * MiB + 7 * GiB

    # Both serve during the lend (H from what is left of its KV pool).
    for _ in range(2):
        served(h.front)
        served(b.front)
    assert lv.states("H") == {"gpu0": "lent"} and lv.states("B") == {"gpu0": "active"}

    # The borrower exits; the holder grows back only after the driver read shows B gone.
    assert b.stop() == 0
    wait_for(lambda: lv.serving("H") and lv.counters()["returns"] == 1, 60, "H grown back")
    freed = lv.entry("B", "freed")
    returning = lv.entry("H", "returning")
    grew = lv.entry("H", "return", after=returning["seq"])
    assert lent["seq"] < freed["seq"] < returning["seq"] < grew["seq"], (freed, returning, grew)
    assert returning["data"]["cards"] == {hs["card"]: 8 * GiB}
    # Every 'return' entry of H follows the freed entry (none speaks for H before the read).
    assert all(e["seq"] > freed["seq"] for e in lv.timeline()
               if e["engine"] == "H" and e["kind"] in ("return", "returning"))
    # lent -> returning -> active, as the timeline records each edge.
    assert "grows back" in returning["text"] and "grew back" in grew["text"]
    hs = lv.lease("H")["shares"][0]
    assert hs["state"] == "active" and hs["lent_bytes"] == 0 and hs["lent_to"] is None, hs
    wait_for(lambda: lv.card_use("gpu0") == {hl["pid"]: HOLDER_USE}, 30,
             "H holds its pool again")
    served(h.front)
    assert lv.oom_events() == 0
    assert h.stop() == 0
