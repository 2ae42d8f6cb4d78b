"""Which held prompts a ``POST /queue`` or ``POST /interrupt`` takes back (issue 37): as ComfyUI
0.3.64's server.py reads the same body (:func:`berth_hosts.comfyui.gate.taken_back_by`)."""

from __future__ import annotations

import pytest
from berth_hosts.comfyui.gate import taken_back_by
from berth_hosts.comfyui.states import GateState as G

HELD = ["a", "5", "held-1"]


def _taken(route, body, state=G.ASLEEP):
    found = taken_back_by(route, body, state)
    return None if found is None else ([p for p in HELD if found[0](p)], found[1])


@pytest.mark.parametrize("route, body, taken", [
    ("queue", {"delete": ["a", "held-1"]}, (["a", "held-1"], "deleted")),
    ("queue", {"delete": [5]}, ([], "deleted")),             # 5 is not "5" to ComfyUI
    ("queue", {"clear": True}, (HELD, "cleared")),
    ("queue", {"clear": False, "delete": ["5"]}, (["5"], "deleted")),
    ("queue", {"delete": None}, ([], "deleted")),            # ComfyUI answers 500
    ("queue", None, None),
    ("queue", ["delete"], None),
    ("interrupt", {"prompt_id": "5"}, (["5"], "interrupted")),
    ("interrupt", {"prompt_id": 5}, ([], "interrupted")),
    ("interrupt", {}, (HELD, "interrupted")),               # no body reads as {} too
    ("interrupt", None, None),                              # JSON null: ComfyUI answers 500
    ("interrupt", [], None),
])
def test_a_body_takes_back_what_comfyui_would(route, body, taken):
    assert _taken(route, body) == taken


def test_an_interrupt_with_no_id_takes_back_nothing_while_comfyui_runs_its_own():
    assert _taken("interrupt", {}, G.OPEN) is None
