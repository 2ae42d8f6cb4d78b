"""A drained run whose new lease is granted is listed once, as its lease, not also as drained
(a new user's `berth status` showed `coder active 14.0GiB` and, under `drained:`, `coder
drained 8.91s ago, 1 request(s) waiting, asking for a card` in the moment between the grant
and the run's word that it serves again)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from berth.daemon.drained import DrainedRun, DrainedRuns
from berth.daemon.status import _drained_rows
from berth.decide.model import Lease, Share, ShareState

G0 = "0000:01:00.0"


def _broker(state: ShareState) -> SimpleNamespace:
    runs = DrainedRuns()
    runs.runs["coder"] = DrainedRun("coder", "127.0.0.1:1", 1, "room for qwen", time.time(),
                                    None, asking=True)
    lease = Lease("coder-1", "coder", {G0: Share(G0, 14 << 30, state=state)})
    ledger = SimpleNamespace(cards={}, leases={lease.id: lease})
    return SimpleNamespace(drained=runs, sched=SimpleNamespace(ledger=ledger))


def test_a_granted_drained_run_is_listed_once_as_its_lease():
    assert _drained_rows(_broker(ShareState.ACTIVE)) == []


def test_a_drained_run_still_waiting_for_its_grant_is_listed_as_drained():
    [row] = _drained_rows(_broker(ShareState.WAITING))
    assert row["engine"] == "coder"


def test_the_drained_heading_is_true_for_a_run_with_no_front():
    """A supervisord program with no front is listed under ``drained`` too; the heading said
    "the next request starts the engine again", which no request can do for it."""
    from berth.board_text import _drained_lines
    lines = _drained_lines([{"engine": "p2", "front": None, "waiters": 0, "asking": True,
                             "drained_s": 3.0, "why": "room for p3"}])
    assert "with none, it asks for its card again" in lines[0], lines
    assert "no front: asking for a card again" in lines[1], lines
