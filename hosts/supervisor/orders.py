"""berthd's instructions for the supervisord programs' leases, and their ends.

Source: issue 7; seed 002 rules 1 and 6. A ``drain`` is ``stopProcess`` through supervisord
(Berth signals nothing itself), reported, and the lease released once a driver read shows the
memory free; park and lend are refused (a supervisord program has none of its own); a lease that
ends under a running program is noted so it is not asked for again. The listener's
:class:`berth_hosts.supervisor.listener.Host` keeps the programs; this acts on them under each
program's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from berth.client import ApiError, BerthdUnavailable
from berth.decide.instruction import Instruction, read_poll
from berth.decide.model import Op

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import run_action

from .rpc import SupervisorError, SupervisorUnavailable

if TYPE_CHECKING:
    from .listener import Host, Program

__all__ = ["Orders", "RETRY_MAX_S"]

log = logging.getLogger("berth.hosts.supervisor")
#: The longest wait between tries to reach berthd or supervisord again (seconds).
RETRY_MAX_S = 5.0


class Orders:
    """Follows berthd's instructions for each lease the :class:`Host` holds. Durations in
    seconds."""

    def __init__(self, host: "Host"):
        self.host = host

    async def follow(self, prog: Program, lease_id: str) -> None:
        after, backoff = 0, 0.2
        while True:
            try:
                r = await self.host.client.instructions(lease_id, after, 20.0)
                backoff = 0.2
            except BerthdUnavailable:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            except ApiError as e:
                if e.status in (404, 410):
                    async with prog.lock:
                        if prog.lease == lease_id:
                            log.warning("%s: berthd no longer knows lease %s", prog.engine,
                                        lease_id)
                            self.host.forget(prog, release=False)
                            prog.kick.set()
                    return
                raise
            readable, errors, after = read_poll(r.get("instructions", []), after)
            for e in errors:
                log.error("%s: berthd sent an instruction this listener cannot read (%s); "
                          "skipped", prog.engine, e)
            for ins in readable:
                await self._instruction(prog, lease_id, ins)
            if r.get("ended"):
                await self._ended(prog, lease_id, r["ended"])
                return

    async def _instruction(self, prog: Program, lease_id: str, ins: Instruction) -> None:
        if ins.op is not Op.DRAIN:
            detail = (f"{ins.op}: a supervisord program has no park or lend of its own; wrap "
                      "its command in `berth run --front` (hosts/supervisor/README.md)")
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.host.client.report(lease_id, ins.op, False, detail)
            return
        async with prog.lock:
            if prog.lease != lease_id:
                return
            prog.drain = ins
            await self.drain(prog)

    async def drain(self, prog: Program) -> None:
        """stopProcess through supervisord, report the drain, release the lease (under lock)."""
        ins, lease = prog.drain, prog.lease
        reason = ins.reason
        if lease is None:
            prog.drain = None
            return
        log.info("%s: drain (%s): stopping %s through supervisord", prog.engine, reason,
                 prog.name)
        prog.stopping = True
        try:
            await run_action(self.host.pm, "berth_drain",
                             self.host.action_context(prog, self.host.stop_timeout_s))
        except MechanismError as e:
            prog.stopping = False
            log.error("%s: %s; trying again at the next tick", prog.engine, e)
            return
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self.host.client.report(lease, "drain", True, f"stopped through supervisord "
                                                           f"({reason})")
        prog.drain = None
        if prog.mode == "gate":
            prog.down = not reason.startswith("room for")
        self.host.forget(prog, release=True)
        prog.stopping = False
        prog.kick.set()                # a gated program drained for room asks again

    async def _ended(self, prog: Program, lease_id: str, reason: str) -> None:
        async with prog.lock:
            if prog.lease != lease_id:
                return
            pid = prog.pid
            log.info("%s: lease %s ended (%s)", prog.engine, lease_id, reason)
            self.host.forget(prog, release=False)
            if pid is None:
                prog.down = prog.down or prog.mode == "gate"
                return
            try:
                info = await asyncio.to_thread(self.host.sup.info, prog.name)
            except (SupervisorError, SupervisorUnavailable) as e:
                log.warning("%s: %s", prog.engine, e)
                prog.kick.set()
                return
            if info.pid != pid:        # its process is gone, and Berth did not stop it
                prog.down = prog.down or prog.mode == "gate"
                prog.kick.set()
                return
            if "drain" in reason:      # the operator drained it while it waited over budget
                prog.drain = Instruction(Op.DRAIN, (), 0, reason=reason)
                prog.lease = lease_id
                await self.drain(prog)
                prog.down = True
            else:
                log.error("%s: pid %s runs without a lease (%s); Berth will not ask again for "
                          "this process", prog.engine, pid, reason)
                prog.skip_pid = pid

    async def release(self, prog: Program, lease_id: str) -> None:
        """Release once the driver confirms the memory free (up to the release grace)."""
        try:
            r = await self.host.client.release(lease_id, self.host.release_wait_s,
                                          f"{prog.name} stopped in supervisord")
        except ApiError as e:
            if e.status == 403:        # a lease of an earlier listener: not ours to release
                log.info("%s: lease %s belongs to an earlier listener; berthd ends it once a "
                         "driver read shows its memory free", prog.engine, lease_id)
            elif e.status not in (404, 410):
                log.warning("%s: releasing %s failed: %s", prog.engine, lease_id, e.message)
            return
        except BerthdUnavailable as e:
            log.warning("%s: cannot release %s: %s", prog.engine, lease_id, e)
            return
        if r.get("ended"):
            log.info("%s: lease %s released; the driver confirmed its memory free",
                     prog.engine, lease_id)
        else:
            log.warning("%s: %s stopped, but its memory is not free %.0fs later: processes it "
                        "started may still hold it (see `berth status`; set stopasgroup=true "
                        "and killasgroup=true in [program:%s]). berthd keeps watching.",
                        prog.engine, prog.name, self.host.release_wait_s, prog.name)
