"""The state file keeps which shares of a waiting lease Berth may still place (issue 25): a
lease that waits across a berthd restart is placed anew at grant time, and one that named its
card keeps it."""

from __future__ import annotations

from berth.daemon import store
from berth.decide.model import Lease, Share

G0, G1 = "0000:01:00.0", "0000:02:00.0"


def _roundtrip(tmp_path, lease: Lease) -> Lease:
    path = tmp_path / "state.toml"
    store.write_atomic(path, store.dump(store.Snapshot(leases=[lease])))
    snap = store.load(path)
    assert snap is not None and not snap.refused
    return snap.leases[0]


def test_a_movable_share_stays_movable(tmp_path):
    lease = Lease("n-1", "N", {G0: Share(G0, 1 << 30), G1: Share(G1, 1 << 30)},
                  movable=frozenset({G1}))
    assert _roundtrip(tmp_path, lease).movable == {G1}


def test_a_lease_with_no_movable_share_has_none(tmp_path):
    assert _roundtrip(tmp_path, Lease("x-1", "X", {G0: Share(G0, 1 << 30)})).movable == set()
