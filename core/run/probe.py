"""The cadence of ``berth run``'s health probe, in one place (issue 34).

:meth:`berth.run.engine.EngineProcess.until_healthy` polls the engine's health with these delays
after a cold start and after a wake, and the policy simulator (``bench/policy``) charges a
Berth cold start the same lag, from here: the two cannot disagree. No I/O and no imports, so the
simulator reads it without aiohttp.

Why a cap of 0.1 s: a front holds its requests until the probe sees the engine answer (with
``--front-health`` llama-swap's own poll passes as soon as the front listens), so every cold start
pays the gap between the engine's first 200 and the probe's next GET. A cap of 0.5 s made that up
to 0.5 s; 0.1 s costs one local GET per 100 ms while an engine loads.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["FIRST_S", "GROWTH", "CAP_S", "delays", "seen_at"]

#: The delay after the first GET, in seconds (the first GET goes at once).
FIRST_S = 0.05
#: Each delay is the one before times this, up to :data:`CAP_S`.
GROWTH = 1.5
#: The longest delay between two GETs, in seconds.
CAP_S = 0.1


def delays() -> Iterator[float]:
    """The delays between the probe's GETs, in seconds: :data:`FIRST_S`, growing by
    :data:`GROWTH`, capped at :data:`CAP_S`; endless."""
    delay = FIRST_S
    while True:
        yield delay
        delay = min(delay * GROWTH, CAP_S)


def seen_at(ready_s: float) -> float:
    """When the probe, started at 0, first sees an engine that answers from ``ready_s`` on
    (seconds, >= ``ready_s``): the time of its first GET at or after ``ready_s``. A GET's own
    round trip (a local request, well under a millisecond) is not counted."""
    at = 0.0
    for d in delays():
        if at >= ready_s - 1e-9:
            return at
        at += d
    raise AssertionError("unreachable: delays() is endless")
