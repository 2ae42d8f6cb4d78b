"""The real llama-swap (v250-5-g0bdb37) with a config wrapped by ``berth llama-swap wrap``, real
``llama-server`` models, and berthd on a simulated card they cannot share (issue 30).

Each model's server runs through ``berth-sim-charge``, so its memory shows on the simulated card
as a GPU engine's would: 3 GiB each on a 4 GiB card with a 512 MiB reserve, so only one fits.
"""

import json
import signal

import pytest

from bench.realswap import Model, wait_until

pytestmark = pytest.mark.real

GiB = 1 << 30


def two(**kw) -> list[Model]:
    return [Model("tiny-a", "tiny-a.gguf", **kw), Model("tiny-b", "tiny-b.gguf", **kw)]


def servers(swap) -> list:
    return swap.processes("llama-server")


def test_chat_a_then_b_on_a_card_they_cannot_share(real_swap):
    swap = real_swap(two()).start()
    a = swap.chat("tiny-a")
    assert a.status == 200, a.body
    assert a.json()["choices"][0]["message"]["content"]
    assert swap.leases() == {"tiny-a": "active"}
    assert swap.sim_card()["used_bytes"] == 3 * GiB     # the real engine's memory shows
    b = swap.chat("tiny-b")
    assert b.status == 200, b.body
    # B's lease needed A's room: A was drained (wrap's default here, without cuda-checkpoint)
    wait_until(lambda: swap.leases() == {"tiny-b": "active"}, 30, "only tiny-b leased")
    st = swap.berth_status()
    assert st["counters"]["drains"] >= 1
    wait_until(lambda: len(servers(swap)) == 1, 30, "one llama-server left")
    again = swap.chat("tiny-a")
    assert again.status == 200, again.body
    assert swap.sim_card()["oom_events"] == 0
    assert json.loads(a.body)["model"]
