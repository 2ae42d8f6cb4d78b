"""The typed instruction berthd sends a run (``berth.decide.instruction``): one type on both
sides, its wire shape, and a clear error naming the field for one that cannot be read."""

from __future__ import annotations

import json

import pytest
from berth.decide.effects import Instruct
from berth.decide.instruction import Instruction, InstructionError, read_poll
from berth.decide.model import Op

from tests.decide.world import GiB, World, pci_of

G0 = pci_of(0)


def test_what_berthd_sends_reads_back_the_same():
    ins = Instruction(Op.LEND, (G0,), 7, {G0: 2 * GiB}, reason="room for b", quiet_s=3.5)
    wire = json.loads(json.dumps(ins.to_wire()))
    assert wire == {"op": "lend", "seq": 7, "cards": [G0], "bytes": {G0: 2 * GiB},
                    "reason": "room for b", "quiet_s": 3.5, "call_off": False, "move_to": None,
                    "fence_age_s": None}
    assert Instruction.from_wire(wire) == ins
    fenced = Instruction(Op.PARK, (G0,), 10, reason="room for b", quiet_s=60.0, fence_age_s=2.5)
    assert Instruction.from_wire(json.loads(json.dumps(fenced.to_wire()))) == fenced
    move = Instruction(Op.DRAIN, (G0,), 9, reason="room for w", move_to="0000:02:00.0")
    assert Instruction.from_wire(json.loads(json.dumps(move.to_wire()))) == move
    off = Instruction(Op.WAKE, (G0,), 8, reason="the waiter has gone", call_off=True)
    assert Instruction.from_wire(json.loads(json.dumps(off.to_wire()))) == off


def test_the_fences_age_is_counted_when_the_instruction_is_sent():
    """Issue 34, the fence: an instruction made at t = 100 with the waiter's request 0.5 s old,
    sent at t = 103 (the run's poll came late on a loaded machine), says 3.5 s. Before, it said
    0.5 s: the run put the fence 3 s late, past the holder's newer requests, which it then
    forwarded, and the park waited for them (a CI run, load 17)."""
    ins = Instruction(Op.PARK, (G0,), 10, fence_age_s=0.5, made_at=100.0)
    assert ins.to_wire(103.0)["fence_age_s"] == 3.5
    assert ins.to_wire()["fence_age_s"] == 0.5
    assert Instruction(Op.PARK, (G0,), 10, made_at=100.0).to_wire(103.0)["fence_age_s"] is None


def test_the_schedulers_effect_is_an_instruction_addressed_to_a_lease():
    w = World([24 * GiB])
    w.request("a", "a", {G0: 8 * GiB})
    fx = w.s.operator("drain", "a", w.now)
    [drain] = [e for e in fx if isinstance(e, Instruct)]
    assert isinstance(drain, Instruction) and drain.lease_id == "a"
    back = Instruction.from_wire(json.loads(json.dumps(drain.to_wire())))
    assert back == Instruction(Op.DRAIN, (G0,), drain.seq, reason="operator")
    assert "lease_id" not in drain.to_wire()


def test_an_older_berthds_instruction_reads_with_defaults():
    ins = Instruction.from_wire({"op": "park", "seq": 1, "cards": [G0], "extra": True})
    assert (ins.bytes, ins.reason, ins.quiet_s, ins.call_off) == ({}, "", None, False)


@pytest.mark.parametrize("wire, field, value", [
    ({"op": "sing", "seq": 1}, "instruction.op", "'sing'"),
    ({"seq": 1}, "instruction.op", "None"),
    ({"op": "park"}, "instruction.seq", "None"),
    ({"op": "park", "seq": -1}, "instruction.seq", "-1"),
    ({"op": "park", "seq": True}, "instruction.seq", "True"),
    ({"op": "park", "seq": 1, "cards": "0000:01:00.0"}, "instruction.cards", "'0000:01:00.0'"),
    ({"op": "lend", "seq": 1, "bytes": {G0: "2GiB"}}, f"instruction.bytes.{G0}", "'2GiB'"),
    ({"op": "lend", "seq": 1, "bytes": [1]}, "instruction.bytes", "[1]"),
    ({"op": "park", "seq": 1, "quiet_s": -2}, "instruction.quiet_s", "-2"),
    ({"op": "park", "seq": 1, "reason": 5}, "instruction.reason", "5"),
    ({"op": "wake", "seq": 1, "call_off": "yes"}, "instruction.call_off", "'yes'"),
    ("park", "instruction", "'park'"),
])
def test_a_malformed_instruction_is_named_with_its_value(wire, field, value):
    with pytest.raises(InstructionError) as e:
        Instruction.from_wire(wire)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ") and str(e.value).endswith(value)


def test_a_poll_passes_over_what_it_cannot_read():
    raw = [{"op": "park", "seq": 4, "cards": [G0]}, {"op": "sing", "seq": 5},
           {"op": "wake", "seq": "six"}, {"op": "wake", "seq": 7, "cards": [G0]}]
    out, errors, after = read_poll(raw, 3)
    assert [i.seq for i in out] == [4, 7] and after == 7
    assert [e.field for e in errors] == ["instruction.op", "instruction.seq"]
    assert read_poll(None, 3)[1][0].field == "instructions"
