"""The state file keeps which shares of a waiting lease Berth may still place (issue 25): a
lease that waits across a berthd restart is placed anew at grant time, and one that named its
card keeps it. It keeps what was measured of a lease too (its switch and park costs, requests
served), which the turn and rent-or-buy rules read (issue 24)."""

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


def test_what_was_measured_of_a_lease_survives_a_restart(tmp_path):
    """A restarted berthd that forgot a holder's measured switch and park costs gave it a turn
    and a rent of 0 s (it yielded at once after every restart), and read its front's next count
    of requests served as a request just served."""
    lease = Lease("x-1", "X", {G0: Share(G0, 1 << 30)}, served=41, switch_cost_s=3.5,
                  park_cost_s=1.25, last_job_at=1234.5)
    back = _roundtrip(tmp_path, lease)
    assert (back.served, back.switch_cost_s, back.park_cost_s, back.last_job_at) == \
        (41, 3.5, 1.25, 1234.5)


def test_an_older_state_file_without_the_measurements_loads_with_none(tmp_path):
    path = tmp_path / "state.toml"
    store.write_atomic(path, store.dump(store.Snapshot(leases=[Lease("x-1", "X",
                                                                     {G0: Share(G0, 1 << 30)})])))
    text = "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith(("served", "switch_cost_s", "park_cost_s")))
    path.write_text(text)
    snap = store.load(path)
    assert snap is not None and not snap.refused
    assert (snap.leases[0].served, snap.leases[0].switch_cost_s) == (0, 0.0)


def test_a_reaper_owners_lease_stays_one_and_a_wrong_type_is_refused(tmp_path):
    """A restarted berthd that forgot the owner is a subreaper counted a daemonized engine's
    memory as a stowaway's (issue 36's escape, back after every restart)."""
    lease = Lease("x-1", "X", {G0: Share(G0, 1 << 30)}, owner_pid=123,
                  owner_start_time=1.5, reaper=True)
    assert _roundtrip(tmp_path, lease).reaper is True
    assert _roundtrip(tmp_path, Lease("y-1", "Y", {G0: Share(G0, 1 << 30)})).reaper is False
    path = tmp_path / "state.toml"
    path.write_text(path.read_text().replace('engine = "Y"', 'engine = "Y"\nreaper = "yes"'))
    snap = store.load(path)
    assert snap is not None and snap.leases == [] and "reaper" in snap.refused[0], snap.refused


def test_a_waiter_that_makes_no_room_still_makes_none_after_a_restart(tmp_path):
    """A drained run with no front waits as a lease that makes no room (issue 35); a restarted
    berthd that forgot it would drain a holder for it and start the swap it prevents."""
    lease = Lease("x-1", "X", {G0: Share(G0, 1 << 30)}, makes_room=False)
    assert _roundtrip(tmp_path, lease).makes_room is False
    assert _roundtrip(tmp_path, Lease("y-1", "Y", {G0: Share(G0, 1 << 30)})).makes_room is True
