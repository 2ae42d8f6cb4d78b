"""Two ComfyUI instances on one machine, each its own engine entry (issue 28): ``BERTH_ENGINE``
names the entry a node leases as."""

from __future__ import annotations

from tests.berthd import wait_for

ENTRIES = """
[engines.comfyui]
size = "8GiB"
growth_allowance = "1GiB"

[engines.comfyui-b]
size = "6GiB"
growth_allowance = "1536MiB"
"""


def test_two_instances_lease_as_their_own_entries_and_park_apart(world):
    d = world.berthd(entry=ENTRIES)
    a = world.comfyui()
    b = world.comfyui(env={"BERTH_ENGINE": "comfyui-b"})
    wait_for(lambda: d.state_of("comfyui") == "active" and d.state_of("comfyui-b") == "active",
             10, "both leased")
    la, lb = d.lease_of("comfyui"), d.lease_of("comfyui-b")
    assert (la["pid"], lb["pid"]) == (a.proc.pid, b.proc.pid)
    assert la["shares"][0]["size_bytes"] == 8 << 30 and lb["shares"][0]["size_bytes"] == 6 << 30
    assert lb["shares"][0]["reserved_bytes"] == 1536 << 20      # its own entry's allowance
    assert b.berth()["engine"] == "comfyui-b" and a.berth()["engine"] == "comfyui"
    assert d.call("POST", "/v1/operator/park", {"target": "comfyui-b"})[0] == 200
    wait_for(lambda: d.state_of("comfyui-b") == "parked", 15, "b parked")
    assert d.state_of("comfyui") == "active" and a.berth()["gate"]["state"] == "open"
