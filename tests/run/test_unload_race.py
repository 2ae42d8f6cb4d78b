"""The unload race (issue 36; llama-swap #946 with the unload API of #19): an engine whose server
is a daemonized grandchild (it double-forks and calls ``setsid()``) was not counted as its lease's
when its memory showed; llama-swap's unload stopped the run by SIGTERM, "freed" was logged while
the server still held 13 GiB, the freeing memory was taken for a stowaway and the waiter got an
immediate 503 "... nothing under way can change that" (3 of 6 runs).

Now a process in the run's tree counts for the lease from its first byte, the run stops what it
took in, and "freed" is said only when the driver shows it: 10 runs, each stopped by SIGTERM
with a server whose memory frees 2 s after it exits, and a request held by the waiter meanwhile:
no 503, every held request answered (5 runs in the default suite)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.berthd import BERTH
from tests.helpers import wait_for
from tests.run.world import chat, run_cmd

DOUBLE_FORK = str(Path(__file__).with_name("double_fork.py"))
#: Before the fix 3 of 6 runs failed: 5 runs miss it with a chance of 1 in 32; the long form
#: (``BERTH_RELIABILITY=long``) runs the issue's 10. Each run starts two runs and two engines,
#: the suite's longest test at 10 (280 s on a loaded two-core machine; issue 38).
RUNS = 10 if os.environ.get("BERTH_RELIABILITY") == "long" else 5


def _slow_free(world) -> None:
    """The world's berth.toml with the card freeing memory 2 s after a process exits."""
    cfg = world.d.config
    lines = [ln if not ln.startswith("free_delay") else 'free_delay = "2s"'
             for ln in cfg.read_text().splitlines()]
    cfg.write_text("\n".join(lines) + "\n")


@pytest.mark.early(40)
def test_a_run_stopped_by_sigterm_frees_only_when_the_driver_shows_it(world):
    _slow_free(world)
    d = world.start_berthd()
    argv = [sys.executable, DOUBLE_FORK, BERTH, "sim", "engine", "--port", "{port}",
            "--weights", "13GiB", "--load-s", "0.1", "--model", "A"]
    for i in range(RUNS):
        a = world.model("A", run_cmd("A", park=False, engine_argv=argv))
        a.start()
        st = a.stop()                           # llama-swap's unload: SIGTERM to the group
        assert not st.killed, (i, st)
        # ... then it starts B and sends B's request at once, while A's memory frees.
        b = world.model("B", run_cmd("B", park=False))
        b.spawn()
        try:
            ans = chat(_listening(b), "B", max_tokens=4, timeout_s=120)
        except Exception as e:                  # noqa: BLE001 (a 503 is the failure)
            raise AssertionError(f"run {i}: {e}\n{world.log('B')[-3000:]}") from None
        assert ans.content_chunks == 4, (i, ans)
        b.stop()
        wait_for(lambda: d.lease_of("B") is None and d.lease_of("A") is None, 30,
                 "both leases over")
    notes = [e for e in d.timeline() if e["kind"] in ("freed", "stowaway")]
    assert [e for e in notes if e["kind"] == "freed"], notes
    assert [c.oom_events for c in world.sim().cards] == [0]


def _listening(b) -> int:
    """B's front port once it accepts (the request is then held by the front, not refused)."""
    wait_for(lambda: b.health() is not None, 30, "B's front listening")
    return b.port


def test_too_big_for_any_card_reaches_the_client(world):
    """A run asking more than any card has: berthd refuses the lease; the reason reached only the
    run's log. The front answers it (a 503 naming it) to the client, then the run exits 1."""
    import openai
    world.start_berthd()
    big = world.model("Big", run_cmd("Big", size="30GiB", park=False))
    big.spawn()
    port = _listening(big)
    try:
        chat(port, "Big", max_tokens=2, timeout_s=30)
    except openai.APIStatusError as e:
        said = str(e)
        assert e.status_code == 503 and "berthd refused the lease" in said, said
        assert "30" in said or "30.0GiB" in said, said
    else:
        raise AssertionError("a lease too big for any card served a request")
    assert big.proc.wait(30) == 1
    assert "berthd refused the lease" in world.log("Big")
