"""Issue 12 case 5: the baseline is what the card uses with no process on it; a process without a
lease is a stowaway whenever it came, and its bytes go when it goes; the board (``berth status``)
names each stowaway by PID.

Seen on main before the fix: a process holding 8 GiB when berthd started was measured into the
baseline; after it exited and the driver showed the card free, a 20 GiB lease was refused as "more
than its capacity" until berthd restarted."""

from __future__ import annotations

import os
import pwd
import subprocess

from tests.berthd import BERTH, wait_for
from tests.broker.conftest import GiB, declare_sim


def test_a_stowaway_from_before_berthd_leaves_with_its_bytes(tmp_path, berthd, holders):
    declare_sim(tmp_path)
    early = holders()
    assert early.alloc(8 * GiB)
    d = berthd()
    card = d.status()["cards"][0]
    assert card["baseline_bytes"] == 0, card
    wait_for(lambda: d.status()["cards"][0]["stowaway_bytes"] == 8 * GiB, 30,
             "8 GiB of stowaway")
    stow = d.status()["cards"][0]["stowaways"]
    # Named by program and user too (issue 37), so the process to deal with needs no lookup.
    assert [(s["pid"], s["bytes"]) for s in stow] == [(early.pid, 8 * GiB)], stow
    me = pwd.getpwuid(os.getuid()).pw_name
    assert stow[0]["program"] and stow[0]["user"] == me, stow
    board = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                           timeout=30)
    assert f"stowaways 8.0GiB (pid {early.pid} " in board.stdout, board.stdout
    assert f"(user {me}) 8.0GiB)" in board.stdout, board.stdout
    early.exit()
    from berth.sim.cards import SimCards
    wait_for(lambda: SimCards(tmp_path / "sim").snapshot().cards[0].free_bytes == 24 * GiB, 30,
             "the driver to show the card free")
    code, r = d.call("POST", "/v1/leases", {"engine": "big",
                                            "shares": [{"card": "gpu0", "size": "20GiB"}]})
    assert code == 201, r
    code, g = d.call("GET", f"/v1/leases/{r['id']}/grant?timeout=30", timeout=60)
    assert code == 200 and g["granted"], g
    card = d.status()["cards"][0]
    assert card["stowaway_bytes"] == 0 and card["stowaways"] == [], card
