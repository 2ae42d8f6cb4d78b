"""``berth.sim.ports``: ports for the bench's servers, free and below the ephemeral range (a
``bind(0)`` port could be an outgoing connection's by the time its server binds it)."""

from __future__ import annotations

import itertools
import socket

from berth.sim.ports import LOW, ephemeral_low, free_ports


def test_free_ports_are_free_consecutive_and_below_the_ephemeral_range():
    low = ephemeral_low()
    for n in (1, 3):
        base = free_ports(n)
        assert LOW <= base and base + n <= max(low, LOW + n + 1), (base, n, low)
        socks = [socket.create_server(("127.0.0.1", p)) for p in range(base, base + n)]
        for s in socks:
            s.close()


def test_the_ephemeral_range_read_or_linux_default(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000
    assert ephemeral_low(tmp_path / "absent") == 32768


def test_the_docs_fixed_ports_lie_below_the_picked_ones():
    """The host pages' commands (run by tests/docs) listen on fixed ports while other tests pick
    theirs: a picked port must never be one of those (a docs test failed "address already in
    use" once its band overlapped)."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    ports = {int(p) for page in (root / "docs" / "hosts").glob("*.md")
             for p in re.findall(r"127\.0\.0\.1:(\d{4,5})", page.read_text())}
    assert ports and max(ports) < LOW, sorted(ports)


def test_a_tests_ports_are_never_given_twice_and_each_worker_draws_from_its_own_stripe(
        monkeypatch):
    """``tests.helpers.free_port``: two calls in a row could return the same port (one in
    12,000 draws; a test that took two then had both servers on one port), and two xdist
    workers could draw the same port at once."""
    from tests import helpers
    monkeypatch.setattr(helpers, "_GIVEN", set())
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)      # outside xdist: the band
    lo, hi = helpers._stripe()
    drawn = [helpers.free_port() for _ in range(min(1000, (hi - lo) // 4))]
    assert len(set(drawn)) == len(drawn)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "6")
    stripes = []
    for i in range(6):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        stripes.append(helpers._stripe())
        assert stripes[-1][0] <= helpers.free_port() < stripes[-1][1]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(stripes)), stripes
    assert stripes[0][0] == lo and stripes[-1][1] <= hi, stripes
