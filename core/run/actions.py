"""The actions of ``berth run``: berthd's instructions carried out through the plugins.

Source: issue 5; seed 002 "Making room", "Fronts", rules 2 and 4; berth_plugins.hookspecs.

- park / lend: close the front and wait for in-flight requests (up to the release grace; if
  they do not finish the front opens again and the run reports "busy": the engine was never
  touched), then the mechanism (cuda-checkpoint on every CUDA process of the engine's tree, or
  the hook's adapter); the front then sleeps (park) or opens again (lend).
- wake / return: the mechanism, once berthd has confirmed room (rule 2); after a wake the run
  probes the engine's health (up to the wake limit) and opens the front.
- drain: stop the engine (the run's stop sequence).

Every outcome is reported to berthd; a failure is reported and berthd falls back (rule 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import pluggy
from berth.decide.instruction import Instruction
from berth.decide.model import Op, ParkMechanism
from berth.front import Front, FrontState
from berth.process import tree_pids
from berth.run import across
from berth.run.engine import EngineProcess
from berth.run.lease import LeaseClient

from berth_plugins.adapters import PROTOCOL
from berth_plugins.hookspecs import ActionContext, CalledOff
from berth_plugins.manager import run_action

if TYPE_CHECKING:                                   # the CLI builds the options and the run
    from berth.run.cli import RunOptions

__all__ = ["Actions", "Busy"]

log = logging.getLogger("berth.run")

#: Operations that free memory (bounded by the release grace) and that give it back (bounded by
#: the wake limit, and only once berthd has confirmed room).
_FREEING = frozenset({Op.PARK, Op.LEND})
_RESTORING = frozenset({Op.WAKE, Op.RETURN})


def fence_at(ins: Instruction) -> float | None:
    """The instruction's fence on this run's clock (``time.monotonic`` seconds; issue 34):
    requests that reached the front before it are older than the waiter's (berthd sends the
    fence as an age, ``fence_age_s``, counted when it sent the instruction; the trip here
    makes it at most that much later)."""
    return None if ins.fence_age_s is None else time.monotonic() - ins.fence_age_s


class Busy(RuntimeError):
    """The front could not go quiet in time: the park never began."""


class RestoreRefused(RuntimeError):
    """The tool refused to restore the checkpoint onto the cards berthd placed the wake on
    (issue 35): the held requests stay held for the engine's restart after the fallback."""


class Actions:
    """Carries out one run's instructions on its engine and front, and reports each outcome."""

    def __init__(self, opts: RunOptions, pm: pluggy.PluginManager, lease: LeaseClient,
                 engine: EngineProcess, front: Front | None, stop_event: asyncio.Event):
        self.o = opts
        self.pm = pm
        self.lease = lease
        self.engine = engine
        self.front = front
        self.stop_event = stop_event
        #: berthd's reason when it drained the run (the stop sequence names it).
        self.drained: str | None = None
        #: The card berthd moves the engine to (a drain that is a move, issue 35), or None.
        self.move_to: str | None = None
        #: how long the stop may wait for the requests in flight (berthd's quiet_s, issue 12)
        self.drain_quiet_s: float | None = None
        #: the drain's fence (``time.monotonic`` seconds; issue 34), or None
        self.drain_fence_at: float | None = None
        #: bytes this run's engine has lent and not yet grown back, by card
        self.lent: dict[str, int] = {}
        #: set while a park or lend runs (its quiet wait, then its mechanism): berthd's
        #: call-off sets it; the wait ends, the mechanism stops before a step it cannot undo
        self._call_off: asyncio.Event | None = None

    def context(self, op: Op, ins: Instruction,
                device_map: dict[str, str] | None = None) -> ActionContext:
        """The hook's context for instruction ``ins``; ``device_map``: a wake restored onto
        other cards (:func:`berth.run.across.device_map`)."""
        if op in (Op.PARK, Op.WAKE):
            mech = self.o.park
            if self.o.park == ParkMechanism.HOOK:
                mech = self.o.adapter or PROTOCOL
        elif op in (Op.LEND, Op.RETURN):
            mech = self.o.adapter or PROTOCOL
        else:
            mech = PROTOCOL
        ident = self.engine.ident
        pids = list(self.lease.pids) or (sorted(tree_pids(ident.pid)) if ident else [])
        opts = dict(self.o.options)
        if self.o.checkpoint_path:
            opts["checkpoint_path"] = self.o.checkpoint_path
        if device_map:
            opts["device_map"] = dict(device_map)
        timeout = self.lease.limit("release_grace_s") if op in _FREEING \
            else self.lease.limit("wake_limit_s")
        return ActionContext(engine=self.o.engine, mechanism=mech, engine_url=self.engine.url,
                             pid=ident.pid if ident else None,
                             start_time=ident.start_time if ident else None,
                             pids=pids, cards=list(ins.cards), bytes=dict(ins.bytes),
                             use_bytes=dict(self.lease.use),
                             ram_available_bytes=self.lease.ram_available,
                             room_confirmed=op in _RESTORING, timeout_s=timeout,
                             options=opts, call_off=self._call_off if op in _FREEING else None)

    async def carry_out(self, ins: Instruction) -> None:
        """Carry out one instruction and report its outcome to berthd. A drain only sets the
        run's stop event (the run's stop sequence reports it)."""
        op = ins.op
        log.info("instruction %s%s (%s)", op, " (call-off)" if ins.call_off else "", ins.reason)
        if ins.call_off:
            self.call_off()
            return
        if op is Op.DRAIN:
            self.stop_event.set()
            self.drained = ins.reason or "drained"
            self.drain_quiet_s = ins.quiet_s
            self.drain_fence_at = fence_at(ins)
            self.move_to = ins.move_to
            return
        ok, detail = True, ""
        if op is Op.RETURN:
            # A berthd restarted in the middle of a return asks it again (issue 18): what was
            # grown back already is not asked of the engine twice.
            ins = replace(ins, bytes={pci: min(n, self.lent.get(pci, 0))
                                      for pci, n in ins.bytes.items()
                                      if self.lent.get(pci, 0) > 0})
        try:
            if op in _FREEING:
                await self._free(op, ins)
                if op is Op.LEND:
                    for pci, n in ins.bytes.items():
                        self.lent[pci] = self.lent.get(pci, 0) + n
            elif op is Op.RETURN and not ins.bytes:
                log.info("return: nothing lent is left to grow back")
            elif op is Op.WAKE:
                await self._wake(ins)
                if not await self.engine.until_healthy(self.lease.limit("wake_limit_s")):
                    raise RuntimeError("the engine did not answer its health check after the wake")
                if self.front is not None:
                    self.front.open()
            else:
                await run_action(self.pm, f"berth_{op}", self.context(op, ins))
                if op is Op.RETURN:
                    for pci, n in ins.bytes.items():
                        self.lent[pci] -= n
        except (Busy, CalledOff) as e:
            ok, detail = False, str(e)
        except Exception as e:                          # reported; berthd falls back (rule 4)
            ok, detail = False, f"{type(e).__name__}: {e}"
            log.error("%s failed: %s", op, detail)
            if self.front is not None:
                if op is Op.WAKE and not isinstance(e, RestoreRefused):
                    # (A refused restore keeps them: berthd's drain, then a restart, serves.)
                    self.front.fail_held(f"wake failed: {e}")
                    with contextlib.suppress(Exception):
                        self.front.sleep()
                elif op in _FREEING and self.front.state is FrontState.CLOSING:
                    self.front.open()
        await self.lease.report(op, ok, detail)

    async def _wake(self, ins: Instruction) -> None:
        """The wake's mechanism; where berthd placed it on other cards (issue 35), the
        checkpoint is restored there (``--device-map``). A refusal is said and raised: berthd
        falls back to a drain, and the run starts its engine again on the card it is given."""
        try:
            mapping = across.device_map(self.lease.cards, ins.cards, self.lease.card_ids) \
                if self.lease.cards else {}
        except ValueError as e:
            # Cards the run cannot map: the fallback's restart puts the engine where berthd says.
            raise RestoreRefused(f"cannot restore onto {', '.join(ins.cards)}: {e}") from e
        if not mapping:
            await run_action(self.pm, f"berth_{Op.WAKE}", self.context(Op.WAKE, ins))
            return
        names = {p: (self.lease.card_ids.get(p) or {}).get("name", p) for p in ins.cards}
        where = ", ".join(f"{c['name']}→{names[p]}"
                          for c, p in zip(self.lease.cards, ins.cards, strict=True))
        try:
            await run_action(self.pm, f"berth_{Op.WAKE}", self.context(Op.WAKE, ins, mapping))
        except Exception as e:
            across.refused(str(e))
            log.error("%s: the restore onto another card (%s) was refused: %s; berthd falls "
                      "back to a drain, and the engine starts again on the card it is given",
                      self.o.engine, where, e)
            raise RestoreRefused(f"restore onto another card ({where}) refused: {e}") from e
        self.lease.cards = [{**c, "pci": p, "name": names[p],
                             "uuid": self.lease.card_ids[p]["uuid"]}
                            for c, p in zip(self.lease.cards, ins.cards, strict=True)]
        log.info("%s restored onto another card (%s)", self.o.engine, where)

    def call_off(self) -> None:
        """berthd calls off the park (or lend) in progress: if its front still waits for quiet,
        that wait ends and the mechanism never begins; if the mechanism has begun, it stops
        before its next step that cannot be undone (a checkpoint's, undoing its lock: issue
        37); a step already begun is not interrupted."""
        if self._call_off is not None:
            self._call_off.set()
        else:
            log.info("call-off: no park or lend is under way; nothing to call off")

    async def _quiet(self, op: Op, ins: Instruction) -> None:
        """Close the front and wait for its requests in flight, up to berthd's ``quiet_s`` (the
        engine's max_job, issue 12 case 4; an older berthd sends none: the release grace).
        Raises :class:`Busy` or :class:`CalledOff` with the front open again."""
        wait_s = ins.quiet_s
        called = self._call_off or asyncio.Event()
        drained = asyncio.ensure_future(self.front.close_and_drain(
            self.lease.limit("release_grace_s") if wait_s is None else wait_s,
            why=f"a {op} begins: the requests in flight finish first",
            fence_at=fence_at(ins) if op is Op.PARK else None))
        off = asyncio.ensure_future(called.wait())
        try:
            await asyncio.wait({drained, off}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            off.cancel()
        if not drained.done():
            drained.cancel()
            self.front.open()
            raise CalledOff("called off: the waiter it was for has gone")
        if not drained.result():
            self.front.open()
            # "busy": the engine was never touched; berthd calls the park off when
            # nothing waits for the room, else falls back (rule 4).
            raise Busy("busy: in-flight requests did not finish within the grace")

    async def _free(self, op: Op, ins: Instruction) -> None:
        """Park or lend: quiet the front, run the mechanism, then sleep (park) or open (lend).
        Raises :class:`CalledOff` (the front open again) when berthd calls it off in time."""
        self._call_off = asyncio.Event()
        try:
            if self.front is not None:
                await self._quiet(op, ins)
            await run_action(self.pm, f"berth_{op}", self.context(op, ins))
        except CalledOff as e:
            log.info("%s: %s", op, e)
            if self.front is not None and self.front.state is FrontState.CLOSING:
                self.front.open()
            raise
        finally:
            self._call_off = None
        if self.front is not None:
            if op is Op.PARK:
                self.front.sleep()
            else:
                self.front.open()
