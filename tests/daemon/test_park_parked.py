"""``berth park`` of an engine already parked: a no-op that says so, as ``berth wake`` of an
engine already serving is (found by a new user trying the operator commands)."""

from __future__ import annotations

import socket
import subprocess

from tests.berthd import BERTH, berth_run
from tests.helpers import wait_for


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parking_a_parked_engine_says_there_is_nothing_to_park(berthd, runs):
    """The second ``berth park A`` answered ``lease A-...: A can only park when every share is
    active; it is parked`` with exit 1, where ``berth wake A`` of an active A says ``nothing to
    wake`` and exits 0: the operator's wish already holds, so the answer says so and succeeds."""
    d = berthd(policy={"ram_budget": "64GiB"})
    ck = ("--park", "checkpoint", "--checkpoint-path", str(BERTH) + "-sim-cuda-checkpoint")
    runs.append(berth_run(d, "A", "--front", f"127.0.0.1:{_port()}", "--size", "4GiB", *ck,
                          weights="3GiB"))
    wait_for(lambda: d.state_of("A") == "active", what="A active")
    first = subprocess.run([BERTH, "park", "A"], env=d.env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0 and "A parks by checkpoint" in first.stdout, first
    wait_for(lambda: d.state_of("A") == "parked", what="A parked")
    again = subprocess.run([BERTH, "park", "A"], env=d.env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0, again
    assert "A is already parked; nothing to park" in again.stdout, again
    assert d.state_of("A") == "parked"


def test_parking_a_held_engine_says_it_overrides_the_hold(berthd, runs):
    """``berth hold A`` then ``berth park A``: the park goes ahead (the operator's word is the
    last), and the CLI's answer and berthd's log say that it overrode the hold; before, both
    said only the park."""
    d = berthd(policy={"ram_budget": "64GiB"})
    ck = ("--park", "checkpoint", "--checkpoint-path", str(BERTH) + "-sim-cuda-checkpoint")
    runs.append(berth_run(d, "A", "--front", f"127.0.0.1:{_port()}", "--size", "4GiB", *ck,
                          weights="3GiB"))
    wait_for(lambda: d.state_of("A") == "active", what="A active")
    hold = subprocess.run([BERTH, "hold", "A"], env=d.env, capture_output=True, text=True,
                          timeout=60)
    assert hold.returncode == 0, hold
    park = subprocess.run([BERTH, "park", "A"], env=d.env, capture_output=True, text=True,
                          timeout=60)
    assert park.returncode == 0 and "A parks by checkpoint" in park.stdout, park
    assert "A is held by the operator: this park overrides the hold" in park.stdout, park
    assert "berth release-hold A" in park.stdout, park
    wait_for(lambda: "operator park A by pid" in d.log.read_text(), what="the operator's park logged")
    line = next(x for x in d.log.read_text().splitlines() if "operator park A by pid" in x)
    assert line.endswith(", overriding its hold"), line
    assert "this park overrides the hold" in d.log.read_text()
    wait_for(lambda: d.state_of("A") == "parked", what="A parked")
    assert d.lease_of("A")["held"] is True


def test_releasing_a_hold_that_is_not_there_says_so(berthd, runs):
    """``berth release-hold A`` of an A never held answered ``A no longer held``, twice in a
    row alike (a new user's find): it read as if a hold had been there and was now gone. As a
    park of a parked engine, the answer says the wish already holds; a second ``berth hold``
    says A is already held."""
    d = berthd()
    runs.append(berth_run(d, "A", "--size", "4GiB", weights="3GiB"))
    wait_for(lambda: d.state_of("A") == "active", what="A active")

    def op(*argv):
        r = subprocess.run([BERTH, *argv, "A"], env=d.env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r
        return r.stdout

    assert "A is not held; nothing to release" in op("release-hold")
    assert "A held by the operator" in op("hold")
    assert "A is already held; nothing to hold" in op("hold")
    assert "A no longer held" in op("release-hold")
    assert "A is not held; nothing to release" in op("release-hold")
