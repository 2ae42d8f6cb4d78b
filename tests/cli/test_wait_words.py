"""``berth status`` on a waiter held off by a higher priority: it says until when the holder's
priority protects its card and what a user can do about it (a fresh user's check, 2026-12-03:
the line named the holder and its priority, and nothing to act on)."""

from __future__ import annotations

import subprocess
import urllib.request

from tests.berthd import BERTH, berth_run
from tests.helpers import free_port, wait_for


def test_a_waiter_behind_a_higher_priority_is_told_until_when_and_what_to_do(berthd, runs):
    d = berthd(cards=(("gpu0", "12GiB"),), reserve="512MiB")
    port = free_port()
    runs.append(berth_run(d, "vip", "--priority", "10", "--size", "10GiB",
                          "--front", f"127.0.0.1:{port}", weights="9GiB"))
    wait_for(lambda: (le := d.lease_of("vip")) and le["ready"], 60, "vip serving")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=b'{"messages": [{"role": "user", "content": "hi"}]}',
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    wait_for(lambda: d.lease_of("vip")["keep_warm_until"], 30, "vip's keep_warm")
    runs.append(berth_run(d, "small", "--size", "6GiB", weights="5GiB"))
    wait_for(lambda: any(w["engine"] == "small" and w.get("why") for w in d.status()["waiting"]),
             60, "small waiting with a reason")
    out = subprocess.run([BERTH, "status"], capture_output=True, text=True, env=d.env,
                         timeout=60).stdout
    waiting = out[out.index("waiting:"):]
    assert "vip's priority 10 keeps gpu0 until its keep_warm ends at " in waiting, out
    assert "`berth drain vip`" in waiting and "--priority 10 or more" in waiting, out
