"""The instruction berthd sends the run (or host plugin) that holds a lease: park, wake, lend,
return or drain. One type for both sides: berthd's scheduler makes it (its
:class:`~.effects.Instruct` effect is an :class:`Instruction` addressed to a lease), the control
API sends :meth:`Instruction.to_wire`, and ``berth run``, the ComfyUI node and the supervisord
listener read it back with :meth:`Instruction.from_wire`.

Source: DESIGN.md "The processes" (berthd decides, the run acts); issue 4 (instructions long-polled
at ``GET /v1/leases/{id}/instructions``, kept until reported); issue 12 case 4 (``quiet_s``).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .model import Op

__all__ = ["Instruction", "InstructionError", "read_poll"]


class InstructionError(ValueError):
    """An instruction that cannot be read. ``field`` names it (``instruction.op``,
    ``instruction.bytes.<pci>``, ...); the message starts with it and gives the value."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Instruction:
    """One instruction. ``op``: what to do. ``cards``: the PCI addresses it acts on (a park,
    wake or drain acts on the whole lease; a lend or return on the cards in ``bytes``).
    ``seq``: its number; numbers grow, across berthd restarts too, and a reader asks for those
    after the last it saw. ``bytes``: N per PCI address for a lend or a return. ``reason``: why,
    in words. ``quiet_s``: for a park or a drain, how long the front may wait for its requests in
    flight first (seconds; ``None``: the run's own default, the release grace). ``call_off``:
    a wake that calls off the park in progress if its mechanism has not begun (the waiter it
    was for has gone; issue 24): the run answers the park ``called off`` and keeps serving, or,
    once the checkpoint has begun, lets the park finish and does nothing more.
    ``fence_age_s``: for a park or a drain of a busy holder (issue 34, the fence), while its
    front waits for quiet it still forwards the held requests that arrived more than this many
    seconds before the instruction was made (those older than the waiter's), and holds the
    rest, so the park waits for the running and older requests only (``None``: the front
    forwards nothing more). ``made_at``: when berthd made it (its clock; never on the wire):
    :meth:`to_wire` counts the fence's age at the send, so the time an instruction waits for
    its poll does not move the fence past requests that came after the waiter's."""

    op: Op
    cards: tuple[str, ...]
    seq: int
    bytes: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    quiet_s: float | None = None
    call_off: bool = False
    #: For a drain that is a move (issue 35): the card (PCI address) the engine goes to; the run
    #: keeps its front holding requests and asks for its card again at once.
    move_to: str | None = None
    fence_age_s: float | None = None
    made_at: float | None = field(default=None, compare=False)

    def to_wire(self, now: float | None = None) -> dict:
        """The JSON object the control API sends: ``{"op", "seq", "cards": [pci], "bytes":
        {pci: N}, "reason", "quiet_s", "call_off", "move_to", "fence_age_s"}``; ``now``
        (berthd's clock): the fence's age is counted then, not when it was made."""
        age = self.fence_age_s
        if age is not None and now is not None and self.made_at is not None:
            age += max(0.0, now - self.made_at)
        return {"op": self.op.value, "seq": self.seq, "cards": list(self.cards),
                "bytes": dict(self.bytes), "reason": self.reason, "quiet_s": self.quiet_s,
                "call_off": self.call_off, "move_to": self.move_to,
                "fence_age_s": age}

    @classmethod
    def from_wire(cls, d: object) -> Instruction:
        """Read one instruction as :meth:`to_wire` writes it. ``op`` and ``seq`` are required;
        ``cards``, ``bytes``, ``reason``, ``quiet_s`` and ``call_off`` may be missing (an older
        berthd sends neither of the last two); other keys are ignored. Raises
        :class:`InstructionError` naming the field and its value."""
        if not isinstance(d, dict):
            raise InstructionError("instruction", f"expected an object, got {d!r}")
        op = d.get("op")
        if op not in {o.value for o in Op}:
            raise InstructionError("instruction.op", f"expected one of "
                                   f"{', '.join(o.value for o in Op)}, got {op!r}")
        call_off = d.get("call_off", False)
        if not isinstance(call_off, bool):
            raise InstructionError("instruction.call_off", f"expected true or false, got "
                                                           f"{call_off!r}")
        move_to = d.get("move_to")
        if move_to is not None and not isinstance(move_to, str):
            raise InstructionError("instruction.move_to", f"expected a PCI address, got "
                                                          f"{move_to!r}")
        return cls(Op(op), _cards(d.get("cards", [])), _count("instruction.seq", d.get("seq")),
                   _bytes(d.get("bytes", {})), _reason(d.get("reason", "")),
                   _seconds("instruction.quiet_s", d.get("quiet_s")), call_off, move_to,
                   _seconds("instruction.fence_age_s", d.get("fence_age_s")))


def read_poll(raw: object, after_seq: int
              ) -> tuple[list[Instruction], list[InstructionError], int]:
    """Read the ``instructions`` list of one poll answer (``GET
    /v1/leases/{id}/instructions``): ``(instructions, errors, after_seq)``. An instruction that
    cannot be read (from a berthd newer than its reader) comes back as an error naming the
    field, and is passed over: ``after_seq`` moves past every number that reads, so the next
    poll does not ask for it again."""
    if not isinstance(raw, list):
        return [], [InstructionError("instructions", f"expected a list, got {raw!r}")], after_seq
    out: list[Instruction] = []
    errors: list[InstructionError] = []
    for d in raw:
        try:
            ins = Instruction.from_wire(d)
        except InstructionError as e:
            errors.append(e)
            seq = d.get("seq") if isinstance(d, dict) else None
            if isinstance(seq, int) and not isinstance(seq, bool):
                after_seq = max(after_seq, seq)
            continue
        after_seq = max(after_seq, ins.seq)
        out.append(ins)
    return out, errors, after_seq


def _count(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InstructionError(name, f"expected a whole number >= 0, got {v!r}")
    return v


def _cards(v: object) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
        raise InstructionError("instruction.cards", f"expected a list of PCI addresses, "
                                                    f"got {v!r}")
    return tuple(v)


def _bytes(v: object) -> dict[str, int]:
    if not isinstance(v, dict):
        raise InstructionError("instruction.bytes", f"expected an object of PCI address to "
                                                    f"bytes, got {v!r}")
    return {str(pci): _count(f"instruction.bytes.{pci}", n) for pci, n in v.items()}


def _reason(v: object) -> str:
    if not isinstance(v, str):
        raise InstructionError("instruction.reason", f"expected text, got {v!r}")
    return v


def _seconds(name: str, v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise InstructionError(name, f"expected seconds >= 0 or null, got {v!r}")
    return float(v)
