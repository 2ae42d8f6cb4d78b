"""The lease client of ``berth run``: everything the run says to berthd and hears from it.

Source: issue 5; seed 002 "Why the run owns the front for a routed engine", rule 1 (berthd
confirms every release with a driver read; the run's word is never proof).

1. :meth:`LeaseClient.acquire`: ask for the lease and wait for the grant; the front answers
   reads with 503 and holds writes meanwhile. With berthd down the run fails open (the engine
   runs unleased, with a warning) only where it fits beside what the card holds
   (:mod:`berth.run.failopen`), else it waits for berthd up to ``--start-limit``; with
   ``--require-berthd`` it always waits.
2. :meth:`LeaseClient.attach` the engine's pid and start time, :meth:`LeaseClient.ready` once
   it answers (its minimum turn starts).
3. :meth:`LeaseClient.follow`: long-poll berthd's instructions and hand each to the actions, one
   at a time; a drain calls off the action in progress. It survives berthd restarts and
   re-attaches (asks for a new lease adopting the running engine) when berthd lost the lease.
4. :meth:`LeaseClient.report` each action's outcome; :meth:`LeaseClient.release` at the end,
   waiting up to ``release_wait_s`` for the driver to confirm the memory free.

The front's callbacks (:meth:`on_wake`, :meth:`on_unwanted`, :meth:`on_activity`, in
:mod:`berth.run.front_calls`) tell berthd what clients ask for. The lease request a run line
makes (:func:`request_body`) and berthd's refusal of it in the run line's words
(:func:`in_flags`) are here together: the command line (:mod:`berth.run.cli`) builds the
options, this module reads them (issue 38: no import circle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from typing import TYPE_CHECKING, Awaitable, Callable

from berth.client import ApiError, BerthdUnavailable, Client
from berth.decide.instruction import Instruction, read_poll
from berth.decide.model import Op
from berth.decide.units import format_size
from berth.front import Front
from berth.process import ProcessId
from berth.run.across import detect
from berth.run.engine import EngineProcess
from berth.run.failopen import FailOpen, Room
from berth.run.front_calls import FrontCallbacks, held_asker
from berth.run.pins import pinned
from berth.run.waits import WaitWords

if TYPE_CHECKING:                                   # the CLI builds the options and the run
    from berth.run.cli import RunOptions

__all__ = ["LeaseClient", "DEFAULT_LIMITS", "request_body", "in_flags"]

log = logging.getLogger("berth.run")

#: Time limits (seconds) when neither the run line nor berthd's ``[policy]`` gives one.
DEFAULT_LIMITS = {"wait_limit_s": 120.0, "release_grace_s": 20.0, "wake_limit_s": 60.0}

_GRANT_POLL_S = 20.0
_INSTRUCTION_POLL_S = 20.0


async def _cancel(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to finish (its cleanup runs: a tool it ran is killed)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def request_body(o: RunOptions, restore_across: bool = False, makes_room: bool = True,
                 asker: tuple[str | None, float | None] = (None, None)) -> dict:
    """The ``POST /v1/leases`` body for a run line: what its flags give; berthd fills the rest
    from the engine's ``[engines.<name>]`` entry. ``restore_across``: its checkpoint restores
    onto another card (:func:`berth.run.across.detect`; issue 35). ``makes_room``: ``False``
    for a drained run with no front asking for its card again (no holder makes room for it).
    ``asker``: the client key of the oldest request its front holds and that request's age in
    seconds, as a wake says them: a drained run asks again for a held request, and a holder
    whose last answer went to that client yields at once (issue 34).

    ``lend`` is sent only with --lend: a field the body has is the run line's word and berthd
    does not fill it from the entry, so a ``"lend": false`` always sent hid ``lend = true`` in
    berth.toml."""
    body: dict = {"engine": o.engine, "owner_pid": os.getpid()}
    if o.lend:
        body["lend"] = True
    if asker[0] is not None and asker[1] is not None:
        body["client"], body["client_age_s"] = asker[0], round(max(0.0, asker[1]), 3)
    if restore_across:
        body["restore_across"] = True
    if not makes_room:
        body["makes_room"] = False
    from berth.run.reaper import is_subreaper
    if is_subreaper():
        # Its descendants are the engine's, daemonized ones included: berthd counts them for
        # the lease from their first byte (issue 36).
        body["reaper"] = True
    if o.sizes:
        body["shares"] = [{"card": c, "size": s} for c, s in o.sizes]
    if o.front:
        body["front"] = o.front
    if o.aliases:
        body["aliases"] = list(o.aliases)
    if o.park:
        body["park"] = o.park
    if o.lend_max:
        body["lend_max"] = o.lend_max
    if o.priority is not None:
        body["priority"] = o.priority
    if o.bound:
        body["bound"] = o.bound
    pin = pinned(o.cmd, o.options) or (None if o.keep_front else
                                        "it exits on a drain (--exit-on-drain)")
    if pin:
        body["pinned"] = pin
    return body


#: A field of the lease request at the start of one of berthd's problems ("shares.0.size: ...",
#: problems joined by "; "), and the flag of berth run that fills it.
_FIELD = re.compile(r"(^|; )(shares\.(\d+)\.(size|card|need)|shares|aliases\.(\d+)|aliases|"
                    r"priority|park|bound|lend_max|lend|front|engine|growth_allowance|keep_warm)"
                    r"(?=: )")
_FLAG = {"priority": "--priority", "park": "--park", "bound": "--bound", "lend": "--lend",
         "lend_max": "--lend-max", "front": "--front", "engine": "--engine",
         "aliases": "--alias", "shares": "--size"}


def in_flags(message: str, o: RunOptions) -> str:
    """berthd's refusal of the lease ``o`` asks, with each lease field it names (``shares.0.size:
    ...``) said as the user wrote it: the flag (``--size 100GiB: ...``, ``--priority: ...``), or,
    for what the run line left to berth.toml, the engine's entry (``[engines.NAME] size``)."""
    entry = f"[engines.{o.engine}]"

    def said(m: re.Match) -> str:
        field, share, part, alias = m.group(2), m.group(3), m.group(4), m.group(5)
        if share is not None:
            n = int(share)
            if n >= len(o.sizes):
                return f"{entry} {part}"         # the shares came from the engine's entry
            card, size = o.sizes[n]
            return f"--size {size}@{card}" if card else f"--size {size}"
        if alias is not None and int(alias) < len(o.aliases):
            return f"--alias {o.aliases[int(alias)]}"
        mine = {"priority": o.priority is not None, "park": bool(o.park),
                "bound": bool(o.bound), "lend": o.lend, "lend_max": bool(o.lend_max)}
        if field in _FLAG and mine.get(field, True):
            return _FLAG[field]
        return f"{entry} {field}"                # berthd filled it from berth.toml

    return _FIELD.sub(lambda m: m.group(1) + said(m), message)


class LeaseClient(FrontCallbacks):
    """One run's lease at berthd. ``lease_id`` is ``None`` while the run is unleased (berthd
    down, or it lost the lease); ``cards`` (``{"pci", "name", "uuid", "bytes"}``), ``driver``
    and ``policy`` come with the grant; ``pids``, ``use`` (bytes per card) and
    ``ram_available`` (bytes) with each instruction poll."""

    def __init__(self, opts: RunOptions, stop_event: asyncio.Event):
        self.o = opts
        self.stop_event = stop_event
        self.client = Client()
        self.front: Front | None = None
        self.lease_id: str | None = None
        self.cards: list[dict] = []
        self.driver: dict = {}
        self.policy: dict = {}
        self.leased = False
        self.refused: str | None = None         # why berthd refused the lease, if it did
        self.after_seq = 0
        self._backoff_s = 0.5
        self.pids: list[int] = []
        self.use: dict[str, int | None] = {}
        self.ram_available: int | None = None
        #: every card berthd knows, ``{pci: {"name", "uuid"}}`` (a wake placed elsewhere)
        self.card_ids: dict[str, dict] = {}
        self._touching = False
        self.waits = WaitWords(opts.engine)
        #: Set when the engine starts unleased (berthd down): it holds the fail-open lock
        #: until the engine's memory shows (:meth:`FailOpen.hold`).
        self.unleased: FailOpen | None = None
        #: False: no holder makes room for this lease (a drained run with no front; issue 35)
        self.makes_room = True
        #: Set when the requests a drained run asks its new grant for have all gone (the
        #: client gave up): :meth:`acquire` then withdraws the request, as a wake is withdrawn.
        self.unwanted = asyncio.Event()
        #: True once :meth:`acquire` withdrew its request because nobody waits for it
        self.withdrawn = False

    async def close(self) -> None:
        self.let_go("the run ends")
        await self.client.close()

    def let_go(self, why: str) -> None:
        """Let the fail-open lock go, if this run holds it (see :mod:`berth.run.failopen`)."""
        if self.unleased is not None:
            self.unleased.let_go(why)

    def limit(self, name: str) -> float:
        """A time limit in seconds (a key of :data:`DEFAULT_LIMITS`): the run line's own, else
        berthd's [policy], else the default."""
        mine = getattr(self.o, name)
        if mine is not None:
            return mine
        return float(self.policy.get(name) or DEFAULT_LIMITS[name])

    def _policy_to_front(self) -> None:
        if self.front is not None:
            self.front.wait_limit_s = self.limit("wait_limit_s")

    # -- asking for the lease ------------------------------------------------------------------
    async def acquire(self) -> dict | None:
        """Request the lease and wait for the grant. ``None``: stopped, refused, or past
        ``--start-limit``. With berthd unreachable: ``{}`` where the engine fits unleased
        (:class:`~berth.run.failopen.FailOpen`: its cards kept as a grant's)."""
        fail_open = FailOpen(self.o, socket=self.client.socket)
        while True:
            try:
                across = await detect(self.o.park, self.o.checkpoint_path, self.o.options)
                r = await self.client.request_lease(request_body(
                    self.o, across, self.makes_room, held_asker(self.front)))
                break
            except BerthdUnavailable as e:
                if self.front is not None:      # a held request's 503 says why it waits
                    self.front.set_cause(f"{str(e).rstrip('.')}; the run waits for berthd")
                room = await fail_open.step(e)
                if room is None:
                    return None
                if isinstance(room, Room):
                    self.cards, self.driver = room.cards, room.driver
                    self.unleased = fail_open
                    return {}
                try:
                    await asyncio.wait_for(self.stop_event.wait(), 1.0)
                    return None
                except TimeoutError:
                    continue
            except ApiError as e:
                self._refused(in_flags(e.message, self.o))
                return None
        self.lease_id = r["id"]
        if self.front is not None and self.front.cause and "waits for berthd" in self.front.cause:
            self.front.set_cause(None)
        self.policy = r.get("policy") or {}
        self._policy_to_front()
        log.info("lease %s requested (%s)", self.lease_id, r["state"])
        while not self.stop_event.is_set():
            if _nobody_waits(self):
                await self._withdraw()
                return None
            g = await self._next_grant()
            if g is None:
                continue
            if g.get("gone"):
                self._refused(f"lease {self.lease_id}: {g['gone']}")
                return None
            self.cards = g["cards"]
            self.driver = g.get("driver") or {}
            self.policy = g.get("policy") or {}
            self._policy_to_front()
            self.leased = True
            log.info("lease %s granted: %s (%s)", self.lease_id,
                     ", ".join(f"{c['name']}={format_size(c['bytes'])}" for c in self.cards),
                     g.get("rung"))
            return g
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self.client.release(self.lease_id, 0, "stopped while waiting")
        if self.front is not None:
            self.front.stopped("stopped while waiting for a lease")
        return None

    async def _next_grant(self) -> dict | None:
        """One grant poll, cut short (``None``) by a stop or by the asking requests gone."""
        wait = asyncio.create_task(self.poll_grant())
        stop = asyncio.create_task(self.stop_event.wait())
        gone = asyncio.create_task(self.unwanted.wait())
        done, _ = await asyncio.wait({wait, stop, gone}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        gone.cancel()
        if wait in done:
            return wait.result()
        wait.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await wait
        return None

    async def _withdraw(self) -> None:
        """Nobody waits for this lease any more: release it before its grant."""
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self.client.release(self.lease_id, 0, "nobody waits for it any more: "
                                      "the requests that asked for it have gone")
        log.info("the requests that asked for a new grant have gone; it is withdrawn")
        self.withdrawn = True

    def _refused(self, why: str) -> None:
        """berthd refused the lease (too big for any card, ...): said in the log and to the
        front's clients, whose held requests and new ones get a 503 with ``why`` (issue 36: the
        reason reached only the run's log). Sets :attr:`refused`."""
        self.refused = why
        log.error("berthd refused the lease: %s", why)
        if self.front is not None:
            self.front.stopped(f"berthd refused the lease: {why}")

    async def poll_grant(self) -> dict | None:
        """One grant poll; it also returns when berthd's reason for the wait changes."""
        try:
            g = await self.client.call("GET", f"/v1/leases/{self.lease_id}/grant",
                                       timeout_s=_GRANT_POLL_S + 10, timeout=_GRANT_POLL_S,
                                       wait_version=self.waits.version)
        except BerthdUnavailable:
            await asyncio.sleep(1.0)
            return None
        except ApiError as e:
            if e.status in (404, 410):
                return {"gone": e.message}
            raise
        self.waits.update(g.get("wait"))
        return g if g.get("granted") else None

    # -- telling berthd ------------------------------------------------------------------------
    async def attach(self, ident: ProcessId | None) -> None:
        """Attach the engine (its pid and start time) to the lease, if leased."""
        if not self.lease_id or ident is None:
            return
        try:
            await self.client.attach(self.lease_id, ident.pid, ident.start_time)
        except (BerthdUnavailable, ApiError) as e:
            log.warning("attach of pid %s failed: %s", ident.pid, e)

    async def ready(self) -> None:
        """Tell berthd the engine answers: its minimum turn starts now."""
        if self.lease_id:
            with contextlib.suppress(BerthdUnavailable, ApiError):
                await self.client.ready(self.lease_id)

    async def report(self, op: Op, ok: bool, detail: str, *, warn: bool = True) -> None:
        """Report an action's outcome; a failure to reach berthd is logged (``warn``) and
        otherwise ignored: berthd's own driver read is what counts (rule 1)."""
        if not self.lease_id:
            return
        try:
            await self.client.report(self.lease_id, op, ok, detail)
        except (BerthdUnavailable, ApiError) as e:
            if warn:
                log.warning("could not report %s to berthd: %s", op, e)

    async def release(self, why: str) -> None:
        """Release the lease, waiting up to ``release_wait_s`` for the driver to confirm the
        memory free."""
        self.let_go("its engine stops")
        if not self.lease_id:
            return
        try:
            r = await self.client.release(self.lease_id, self.o.release_wait_s, why)
            if not r.get("ended"):
                log.warning("lease %s: memory not confirmed free within %.1fs; berthd keeps "
                            "watching it", self.lease_id, self.o.release_wait_s)
        except (BerthdUnavailable, ApiError) as e:
            log.warning("could not release lease %s: %s", self.lease_id, e)

    # -- instructions --------------------------------------------------------------------------
    async def follow(self, carry_out: Callable[[Instruction], Awaitable[None]],
                     engine: EngineProcess) -> None:
        """Long-poll berthd for instructions and ``carry_out`` each, one at a time. Survives
        berthd restarts; asks for a new lease if berthd lost this one. Returns when berthd
        ends the lease.

        Polling goes on while an action runs: a drain calls off the park, wake, lend or return
        in progress and stops the engine at once (rule 4: berthd's release grace and wake limit
        decide when, not the run's own action timeouts, which may be longer)."""
        queued: list[Instruction] = []
        worker: asyncio.Task | None = None

        async def work() -> None:
            while queued:
                await carry_out(queued.pop(0))

        try:
            while True:
                r = await self._poll(engine)
                if r is None:
                    continue
                for ins in await self._read(r.get("instructions", [])):
                    if ins.call_off:
                        await carry_out(ins)     # ends a wait for quiet; never queued
                        continue
                    if ins.op is Op.DRAIN:
                        queued.clear()
                        if worker is not None and not worker.done():
                            log.info("a drain calls off the action in progress")
                            await _cancel(worker)
                        await carry_out(ins)
                        continue
                    queued.append(ins)
                    if worker is None or worker.done():
                        worker = asyncio.create_task(work())
                if r.get("ended"):
                    log.info("lease %s ended (%s)", self.lease_id, r["ended"])
                    return
        finally:
            if worker is not None:
                await _cancel(worker)

    async def _poll(self, engine: EngineProcess) -> dict | None:
        """One instruction poll: berthd's answer, or ``None`` when there is nothing to read this
        time (the run re-attached, berthd is unreachable or refused; it backs off)."""
        if not self.lease_id:
            await _reattach(self, engine)
            return None
        try:
            r = await self.client.call(
                "GET", f"/v1/leases/{self.lease_id}/instructions",
                timeout_s=_INSTRUCTION_POLL_S + 10, after=self.after_seq,
                timeout=_INSTRUCTION_POLL_S, wait_version=self.waits.version)
        except BerthdUnavailable:
            await self._back_off()
            return None
        except ApiError as e:
            if e.status in (404, 410):
                log.warning("berthd no longer knows lease %s (%s); asking for a new one",
                            self.lease_id, e.message)
                self.lease_id = None
                return None
            # Any other refusal must not end the loop (the run would stop hearing
            # drains) nor escape into the stop sequence: say it and poll again.
            log.error("berthd refused the instruction poll: %s; polling again", e)
            await self._back_off()
            return None
        self._backoff_s = 0.5
        self.waits.update(r.get("wait"))
        self.pids = r.get("pids") or []
        self.use = r.get("use") or {}
        self.ram_available = r.get("ram_available_bytes")
        self.card_ids = r.get("cards") or self.card_ids
        return r

    async def _read(self, raw: object) -> list[Instruction]:
        """The instructions of one poll, read (:func:`read_poll`); ``after_seq`` moves past
        each. One this run cannot read (a berthd newer than the run) is logged, naming the
        field and value, and skipped; a poll with nothing readable backs off."""
        out, errors, self.after_seq = read_poll(raw, self.after_seq)
        for e in errors:
            log.error("lease %s: berthd sent an instruction this run cannot read (%s); "
                      "skipped", self.lease_id, e)
        if errors and not out:
            await self._back_off()
        return out

    async def _back_off(self) -> None:
        await asyncio.sleep(self._backoff_s)
        self._backoff_s = min(self._backoff_s * 2, 5.0)

async def _reattach(lease: LeaseClient, engine: EngineProcess) -> None:
    """berthd is back without ``lease``'s lease (or was down at start; called by
    :meth:`LeaseClient.follow`): lease the running engine. The request adopts it (pid and start time; the run is its parent), so berthd counts the
    memory it already holds as the waiting lease's own, not as a stowaway's that would leave
    no room for it. A refusal leaves the run serving unleased; it asks again later."""
    body = request_body(lease.o)
    if engine.ident is not None and engine.running():
        body["pid"], body["start_time"] = engine.ident.pid, engine.ident.start_time
    try:
        r = await lease.client.request_lease(body)
    except BerthdUnavailable:
        await asyncio.sleep(0.25)   # registers first once berthd is back (issue 26)
        return
    except ApiError as e:
        log.warning("berthd refused to lease the running %s: %s; still UNLEASED, asking "
                    "again in 5 s", lease.o.engine, in_flags(e.message, lease.o))
        await asyncio.sleep(5.0)
        return
    lease.lease_id = r["id"]
    lease.let_go("berthd is back and counts it")      # never held while berthd answers
    while True:
        g = await lease.poll_grant()
        if g is not None:
            break
    if g.get("gone"):
        lease.lease_id = None
        return
    lease.cards = g["cards"]
    if engine.ident is not None:
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await lease.client.attach(lease.lease_id, engine.ident.pid, engine.ident.start_time)
        await lease.ready()
    log.info("re-attached %s as lease %s", lease.o.engine, lease.lease_id)


def _nobody_waits(lease: LeaseClient) -> bool:
    """The requests ``lease`` was asked for have gone, and no write came since."""
    if not lease.unwanted.is_set():
        return False
    if lease.front is not None and lease.front.holding:
        lease.unwanted.clear()       # a write came meanwhile: it waits for this grant
        return False
    return True
