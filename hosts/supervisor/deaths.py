"""Programs that died for lack of memory, named (issue 37 "supervisord starts every program at
once"): supervisord starts every ``autostart`` program at once (Supervisor #122), so one that
loads beside the others can find the card full and die. The listener reads the tail of its log,
and when it says the process ran out of memory, names the program and why in its own log and on
berthd's board (``POST /v1/notes``; ``berth status``)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from berth.client import ApiError, BerthdUnavailable, Client

from .rpc import ProcessInfo, Supervisor

if TYPE_CHECKING:
    from .listener import Program

__all__ = ["DEAD_STATES", "Deaths", "out_of_memory"]

log = logging.getLogger("berth.hosts.supervisor")

#: supervisord states of a program whose process ended without Berth's stop.
DEAD_STATES = frozenset({"EXITED", "BACKOFF", "FATAL"})
#: What engines print when a load does not fit (PyTorch, CUDA's runtime and driver, llama.cpp's
#: ggml, vLLM), lower case.
_OOM_WORDS = ("out of memory", "outofmemoryerror", "cuda_error_out_of_memory",
              "cudamalloc failed", "failed to allocate", "no available memory for the cache")


def out_of_memory(log_tail: str) -> str | None:
    """The last line of ``log_tail`` that says the process ran out of memory, cut to 200
    characters, or ``None``."""
    for line in reversed(log_tail.splitlines()):
        if any(w in line.lower() for w in _OOM_WORDS):
            return line.strip()[:200]
    return None


class Deaths:
    """Explains each death of a program once per start, and tells berthd (again at every
    ``TICK_5`` until berthd answers: it may start after the programs autostarted with it)."""

    def __init__(self, sup: Supervisor, client: Client):
        self.sup, self.client = sup, client
        self.due: dict[str, str] = {}            # what berthd was not told yet, by engine

    async def explain(self, prog: "Program", info: ProcessInfo) -> None:
        """Called at each sync. A program that died on its own (EXITED, BACKOFF, FATAL): if its log's tail says it
        ran out of memory, name it and why in the listener's log and on berthd's board (``berth
        status``), once per start (supervisord's start time, whole seconds)."""
        if info.statename not in DEAD_STATES or prog.stopping or prog.said_death == info.start:
            return
        prog.said_death = info.start
        tail = await asyncio.to_thread(self.sup.tail, prog.name)
        line = out_of_memory(tail)
        if line is None:
            return
        text = (f"supervisord program {prog.name} died for lack of memory ({info.statename}, "
                f"exit status {info.exitstatus}): {line!r}. supervisord starts autostart "
                f"programs at once; set mode = \"gate\" with autostart=false, or run its "
                f"command under `berth run --size …`, and Berth admits them in turn")
        log.warning("%s: %s", prog.engine, text)
        self.due[prog.engine] = text
        await self.tell_due()

    async def tell_due(self) -> None:
        """Tell berthd of the deaths it was not told of yet (berthd may start after the
        programs supervisord autostarts with it: tried again at every TICK_5)."""
        for engine, text in list(self.due.items()):
            try:
                await self.client.note(engine, text)
            except BerthdUnavailable:
                return
            except ApiError as e:
                log.info("%s: berthd refused the note (%s); the listener's log says it",
                         engine, e)
            self.due.pop(engine, None)
