"""CUDA's error numbers as cuda-checkpoint exits with them.

Source: reference/park-mechanisms.md "cuda-checkpoint" ("Exit codes"). Shared by the checkpoint
plugin (which reads a failed action's exit status) and the simulator's stand-in tool (which exits
with them), so neither imports the other.
"""

from __future__ import annotations

__all__ = ["CUDA_ERRORS", "cuda_error_of", "INVALID_VALUE", "OUT_OF_MEMORY", "OS_CALL_FAILED",
           "ILLEGAL_STATE", "NOT_SUPPORTED"]

INVALID_VALUE, OUT_OF_MEMORY, OS_CALL_FAILED, ILLEGAL_STATE, NOT_SUPPORTED = 1, 2, 304, 401, 801

#: The CUDA error numbers a failed cuda-checkpoint action exits with.
CUDA_ERRORS = {INVALID_VALUE: "invalid value", OUT_OF_MEMORY: "out of memory",
               OS_CALL_FAILED: "OS call failed", ILLEGAL_STATE: "illegal state",
               NOT_SUPPORTED: "not supported"}


def cuda_error_of(status: int) -> int | None:
    """The CUDA error number behind a process exit status, ``None`` if unknown. An exit status is
    8 bits, so a parent sees the number modulo 256 (``48`` → 304, ``145`` → 401, ``33`` → 801)."""
    for code in CUDA_ERRORS:
        if code & 0xFF == status:
            return code
    return None
