"""``DELETE /v1/leases/{id}/extend`` and the asker watch (issue 28: a request for room ends when
its prompt does, and berthd drops one whose asker's process is gone), on a real berthd."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.berthd import Berthd, GiB
from tests.helpers import wait_for


def _waiting_extension(d: Berthd) -> str:
    """A 20 GiB holder of priority 10 and a growth-bound lease of 1 GiB beside it whose request
    for 2.5 GiB more cannot be met (only 2 GiB are left and the holder outranks it)."""
    code, r = d.call("POST", "/v1/leases", {"engine": "big", "priority": 10,
                                            "shares": [{"card": "gpu0", "size": "20GiB"}]})
    assert code == 201, r
    code, r = d.call("POST", "/v1/leases", {"engine": "comfyui", "bound": "growth",
                                            "growth_allowance": "1GiB",
                                            "shares": [{"card": "gpu0", "size": "10GiB",
                                                        "need": 0}]})
    assert code == 201, r
    lid = r["id"]
    wait_for(lambda: d.state_of("comfyui") == "active", 10, "the small lease granted")
    return lid


def _extensions(d: Berthd) -> list[dict]:
    return [w for w in d.status()["waiting"] if w["kind"] == "extend"]


def test_a_withdrawn_request_leaves_the_queue(berthd):
    d = berthd()
    lid = _waiting_extension(d)
    code, r = d.call("POST", f"/v1/leases/{lid}/extend", {"bytes": int(2.5 * GiB)})
    assert code == 202 and r["waiting"] is True, r
    assert [w["id"] for w in _extensions(d)] == [lid]
    assert d.call("DELETE", f"/v1/leases/{lid}/extend") == (200, {"id": lid, "withdrawn": True})
    assert _extensions(d) == []
    assert any(e["kind"] == "extend.off" and "withdrawn by its asker" in e["text"]
               for e in d.timeline())
    # Nothing left to withdraw: said so, and nothing changes.
    assert d.call("DELETE", f"/v1/leases/{lid}/extend") == (200, {"id": lid, "withdrawn": False})
    assert d.call("DELETE", "/v1/leases/nobody-1/extend")[0] == 404


def test_a_request_whose_asker_is_gone_is_dropped(berthd):
    """The asker is a process of its own (the lease's owner is this test): once it exits, berthd
    drops its request within a few driver reads."""
    d = berthd()
    lid = _waiting_extension(d)
    asker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from tests.berthd import api
        print(api({str(d.sock)!r}, "POST", "/v1/leases/{lid}/extend", {{"bytes": {int(2.5 * GiB)}}}),
              flush=True)
        sys.stdin.read()                     # stays until the test closes its stdin
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        said = asker.stdout.readline()
        assert "202" in said and "'waiting': True" in said, said
        assert [w["id"] for w in _extensions(d)] == [lid]
    finally:
        asker.stdin.close()
        asker.wait(10)
    wait_for(lambda: _extensions(d) == [], 10, "the request dropped")
    off = [e["text"] for e in d.timeline() if e["kind"] == "extend.off"]
    assert off and f"pid {asker.pid}, is gone" in off[0], off
