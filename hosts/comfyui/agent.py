"""The node's agent: ComfyUI's lease with berthd, and the park, wake and growth it carries out.

Source: issue 13 ("At import, inside ComfyUI", "Growth that asks first", "Flags that defeat
unloading"); issue 28 (engine names, withdrawn requests for room, held prompts that say why);
seed 002 rules 1, 3, 4 and "Fronts"; seed 000 "Growth allowance" (extension events);
reference/hosts.md "Threads" (never unload from the event loop: the worker applies
``prompt_queue.set_flag("unload_models"/"free_memory")``) and "Idle signals"
(``get_tasks_remaining() == 0``).

The agent runs in its own thread with its own event loop, so nothing it waits for (berthd's
long polls, a park waiting for the queue) runs on ComfyUI's loop. It:

1. registers ComfyUI's own process (PID and start time) as the lease of its engine entry
   (``$BERTH_ENGINE``, default ``comfyui``: size, card and priority from
   ``[engines.<name>]`` in berth.toml; the growth bound unless the entry names another),
   adopting the process that already runs;
2. carries out berthd's instructions: **park** (close the gate, wait until no prompt is queued,
   running or being posted, set the worker's ``unload_models`` and ``free_memory`` flags, wait
   until the worker took them, answer; berthd confirms with a driver read and falls back as
   usual), **wake** (open the gate), **drain** (as a park, then the gate refuses prompts until
   ComfyUI restarts: Berth does not stop what it did not start, and the agent leases nothing
   more);
3. reports ComfyUI's jobs (gated writes held or handled, prompts queued or running, and when
   the oldest arrived) as ``berth run``'s front does, so an idle ComfyUI yields the card at
   once and a busy one keeps it until its prompts end (issue 16; :mod:`.jobs`);
4. before a prompt passes, asks berthd to extend the reservation when the model files the
   prompt names, plus the allowance, pass it, and withdraws the request when the prompt stops
   waiting (:mod:`.reservation`);
5. follows berthd's reason for the lease's wait (the instruction poll's ``wait``), which held
   prompts show on their page (:mod:`.notice`);
6. with dynamic VRAM, keeps ComfyUI's own budget inside the lease: the loader's headroom is
   the card's total less the reservation, updated at the grant, park, wake and extension.

berthd down: the gate is ``off`` (everything passes) and the agent keeps asking to register,
as ``berth run`` fails open. ``--highvram``/``--gpu-only``: unloading frees nothing, so the
lease is registered without the park capability and the log and the board say why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from typing import Any

from berth.client import ApiError, BerthdUnavailable, Client, JobReporter
from berth.decide.instruction import Instruction, read_poll
from berth.process import identify

from . import comfy, jobs, notice
from .gate import Gate, GateState
from .reservation import Reservation

__all__ = ["Agent", "ENGINE", "DEFAULT_ALLOWANCE_BYTES", "engine_name"]

log = logging.getLogger("berth.comfyui")

G = GateState
ENGINE = "comfyui"
DEFAULT_ALLOWANCE_BYTES = 1 << 30      # activations and the VAE's decode, when no entry says
_RETRY_S = 2.0
_POLL_S = 20.0


def engine_name() -> str:
    """The engine entry this ComfyUI leases as: ``$BERTH_ENGINE``, else ``comfyui``. Two
    ComfyUI instances on one machine each need their own (``BERTH_ENGINE=comfyui-b``), or
    berthd's board and ``berth park comfyui`` cannot tell them apart."""
    return (os.environ.get("BERTH_ENGINE") or "").strip() or ENGINE


def _entry(engine: str):
    """The ``[engines.<engine>]`` entry of the berth.toml berthd reads, or None."""
    from berth.config import ConfigError, load_config
    try:
        return load_config()[0].engines.get(engine)
    except (ConfigError, OSError) as e:
        # ComfyUI runs on (the node fails open), but the config problem is said, not hidden.
        log.error("Berth: berth.toml does not load, so the engine entry %r is not used: %s",
                  engine, e)
        return None


class Agent(Reservation):
    """ComfyUI's side of its lease. ``server`` is ``PromptServer.instance``; ``args`` ComfyUI's
    parsed command line; ``engine`` the engine entry (default :func:`engine_name`). Times in
    seconds, sizes in bytes."""

    def __init__(self, server: Any, args: Any = None, engine: str | None = None,
                 url: str | None = None):
        self.server, self.args, self.engine = server, args, engine or engine_name()
        self.queue = server.prompt_queue
        self.url = url or (f"http://{getattr(args, 'listen', '127.0.0.1') or '127.0.0.1'}:"
                           f"{getattr(args, 'port', 8188)}")
        self.defeated = comfy.unloading_defeated(args)
        self.entry = _entry(self.engine)
        self.allowance_bytes = (self.entry.growth_allowance if self.entry is not None
                                and "growth_allowance" in self.entry.model_fields_set
                                else DEFAULT_ALLOWANCE_BYTES)
        self.gate = Gate(on_wake=lambda: ask_wake(self), before_write=self.before_prompt,
                         on_notice=lambda body, text: notice.send_text(server, body, text),
                         on_unwanted=lambda: self.lease_id and self.call(
                             withdraw_wake(self._client, self.lease_id)))
        self.extend_waits = notice.WaitMeter()
        self.me = identify(os.getpid())
        self.lease_id: str | None = None
        self.card: str | None = None
        self.reserved_bytes = 0
        self.size_bytes: int | None = None
        self.headroom_bytes: int | None = None      # dynamic VRAM's, as last set
        self.health = "starting"
        self.policy: dict = {}
        self.after_seq = 0
        self.wait_version = 0                       # of berthd's reason for the lease's wait
        self.loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None
        self._grow_lock: asyncio.Lock | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- lifetime ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the agent's thread (a daemon: it ends with ComfyUI)."""
        ready = threading.Event()

        def main() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self._grow_lock = asyncio.Lock()
            ready.set()
            self.loop.run_until_complete(self._main())

        self._thread = threading.Thread(target=main, name="berth-comfyui", daemon=True)
        self._thread.start()
        ready.wait(5.0)

    def call(self, coro) -> concurrent.futures.Future:
        """Run ``coro`` on the agent's loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _spawn(self, coro) -> None:
        """Run ``coro`` on the agent's loop as a task of its own (kept: the loop holds tasks
        only weakly). Called on the agent's loop."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _main(self) -> None:
        self._client = Client()
        self._spawn(JobReporter(lambda: jobs.work(self.gate, self.queue),
                                lambda: self.lease_id, lambda: self._client,
                                clients=self.gate.clients).run())
        if self.defeated:
            log.warning("Berth: ComfyUI runs with %s: unloading frees nothing (the GPU is the "
                        "offload device), so Berth cannot park it; registering without park. "
                        "Run ComfyUI without %s to let it share the card.",
                        self.defeated, self.defeated)
        while self.gate.state is not G.STOPPED:     # drained: lease nothing more
            try:
                await self._register()
                await self._instructions()
            except asyncio.CancelledError:
                raise
            except Exception:                     # never let the agent die silently
                log.exception("Berth: the agent failed; starting over")
                self.lease_id = None
                self.gate.fail_open("agent error")
                await asyncio.sleep(_RETRY_S)

    # -- the lease ---------------------------------------------------------------------------
    def _body(self) -> dict:
        e = self.entry
        body: dict = {"engine": self.engine, "host": "comfyui"}
        if self.me is not None:
            body["pid"], body["start_time"] = self.me.pid, self.me.start_time
        if e is not None and e.size is not None:
            share: dict = {"size": e.size}
            if e.card:
                share["card"] = e.card
            # Growth bound: reserve what ComfyUI holds now plus the allowance; prompts extend it.
            share["need"] = e.need if e.need is not None else 0
            body["shares"] = [share]
            body["bound"] = e.bound.value if "bound" in e.model_fields_set else "growth"
            body["growth_allowance"] = self.allowance_bytes
        why = f"; {self.defeated}: unloading frees nothing, no park" if self.defeated else ""
        body["front"] = f"comfyui-node {self.url}{why}"[:300]
        body["park"] = None if self.defeated else "hook"
        # Berth never stops ComfyUI (the node runs inside it): it makes room only by a park,
        # and with unloading defeated, not at all; berthd then tells waiters why at once.
        body["drain"] = False
        if self.defeated:
            body["no_park"] = f"ComfyUI runs with {self.defeated}: unloading frees nothing"
        return body

    async def _register(self) -> None:
        r = await self._request_lease()
        self.lease_id, self.policy = r["id"], r.get("policy") or {}
        self.gate.wait_limit_s = float(self.policy.get("wait_limit_s") or 120.0)
        cards = r.get("cards") or []
        self.card = cards[0]["pci"] if cards else None
        log.info("Berth: ComfyUI (pid %s) registered as lease %s of engine %s (%s)",
                 os.getpid(), self.lease_id, self.engine, r["state"])
        if r["state"] != "active":
            self.gate.move(G.STARTING, "the lease waits for room")
            self.health = "waiting for room"
        else:
            # Granted, but the gate opens only once the reservation is read: a prompt that
            # passed the gate still off meanwhile loaded past the lease unchecked (berthd then
            # extended it from a driver read, behind the node's back).
            self.gate.move(G.STARTING, "the lease is granted; its reservation is read first")
        while True:
            try:
                g = await self._client.wait_grant(self.lease_id, _POLL_S)
            except BerthdUnavailable:
                await asyncio.sleep(_RETRY_S)
                continue
            if g.get("granted"):
                break
            self._follow_wait(g.get("wait"))
        self.policy = g.get("policy") or self.policy
        await self._sync_reservation()
        self.health = "leased" + (f"; {self.defeated}: no park" if self.defeated else "")
        self.gate.move(G.OPEN, "lease granted")
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self._client.ready(self.lease_id)

    async def _request_lease(self) -> dict:
        said = False
        while True:
            try:
                return await self._client.request_lease(self._body())
            except BerthdUnavailable as e:
                if not said:
                    log.warning("Berth: %s; ComfyUI runs UNLEASED (fail-open): Berth cannot "
                                "protect this card until berthd is back", e)
                    said = True
                self.health = "unleased: berthd is not reachable"
                self.gate.fail_open("berthd is not reachable")
            except ApiError as e:
                log.error("Berth: berthd refused ComfyUI's lease: %s", e.message)
                self.health = f"unleased: berthd refused the lease: {e.message}"
                self.gate.fail_open("lease refused")
            await asyncio.sleep(_RETRY_S)

    def _follow_wait(self, wait: dict | None) -> None:
        """berthd's reason for the lease's wait (``{"why", "lasting", "version"}``), which held
        prompts show; a lasting one sets the gate's ``Retry-After`` to 30 s."""
        if isinstance(wait, dict):
            self.gate.cause = wait.get("why")
            self.gate.lasting = bool(wait.get("lasting"))
            self.wait_version = int(wait.get("version") or 0)

    # -- instructions ------------------------------------------------------------------------
    async def _instructions(self) -> None:
        backoff = 0.5
        while True:
            # Back from "off", ask without waiting: the gate must follow the lease as soon as
            # berthd answers, not after a long poll with no growth check. The poll also ends
            # when berthd's reason for the lease's wait changes (wait_version).
            wait = 0.0 if self.gate.state is G.OFF else _POLL_S
            try:
                r = await self._client.call(
                    "GET", f"/v1/leases/{self.lease_id}/instructions", timeout_s=wait + 10,
                    after=self.after_seq, timeout=wait, wait_version=self.wait_version)
                backoff = 0.5
            except BerthdUnavailable:
                # berthd went away: fail open, and lease again when it is back.
                self.gate.fail_open("berthd is not reachable")
                self.health = "unleased: berthd is not reachable"
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue          # a berthd that restarted keeps the lease, or answers 404/410
            except ApiError as e:
                if e.status in (404, 410):
                    log.warning("Berth: berthd no longer knows lease %s (%s); registering again",
                                self.lease_id, e.message)
                    self.lease_id = None
                    return
                log.error("Berth: berthd refused the instruction poll: %s", e)
                await asyncio.sleep(backoff)
                continue
            if not await self._follow(r):
                return

    async def _follow(self, r: dict) -> bool:
        """Take in one instruction poll's answer; False once the lease ended (or drained)."""
        self._follow_wait(r.get("wait"))
        if self.gate.state is G.OFF:
            if set((r.get("states") or {}).values()) == {"parked"}:
                # A prompt asks berthd to wake it, as before berthd went away.
                self.gate.move(G.ASLEEP, "berthd is back and keeps the lease parked")
                self.health = "parked"
            else:
                self.gate.move(G.OPEN, "berthd is back and keeps the lease")
                self.health = "leased"
        readable, errors, self.after_seq = read_poll(r.get("instructions", []), self.after_seq)
        for e in errors:
            log.error("Berth: berthd sent an instruction this node cannot read (%s); skipped", e)
        for ins in readable:
            await self._carry_out(ins)
        if r.get("ended") or self.gate.state is G.STOPPED:
            log.info("Berth: lease %s ended (%s)", self.lease_id, r.get("ended") or "drained")
            self.lease_id = None
            return False
        return True

    async def _carry_out(self, ins: Instruction) -> None:
        op = ins.op
        if ins.call_off:
            # The park it would call off has finished by now (instructions run one at a
            # time): there is nothing left to undo.
            log.info("Berth: call-off of a park that has finished (%s)", ins.reason)
            return
        log.info("Berth: instruction %s (%s)", op, ins.reason)
        ok, detail = True, ""
        if op == "park" or op == "drain":
            ok, detail = await self.park()
            if op == "drain":
                # Berth never stops what it did not start: the models are unloaded and the
                # gate refuses prompts until ComfyUI restarts (and leases again).
                why = (f"drained by Berth ({ins.reason}); restart ComfyUI to lease "
                       f"again")
                log.warning("Berth: %s", why)
                self.gate.stop(why)
                self.health = why
                ok, detail = True, "models unloaded; ComfyUI keeps running, its gate refuses prompts"
        elif op == "wake":
            await self.wake()
        else:
            ok, detail = False, f"ComfyUI does not {op}: only park and wake"
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await self._client.report(self.lease_id, op, ok, detail)

    async def park(self) -> tuple[bool, str]:
        """Close the gate, wait for the queue to go idle, have ComfyUI's worker unload; returns
        ``(ok, detail)``. ``detail`` starts with "busy" when the queue did not go idle within
        the release grace (the gate opens again: nothing was touched)."""
        if self.defeated:
            return False, f"ComfyUI runs with {self.defeated}: unloading frees nothing"
        st = self.gate.state
        if st not in (G.OPEN, G.OFF, G.CLOSING, G.ASLEEP):
            return False, f"busy: the gate is {st}"
        grace = float(self.policy.get("release_grace_s") or 20.0)
        end = time.monotonic() + grace
        if st is not G.ASLEEP:
            self.gate.move(G.CLOSING, "park: waiting for the queue")
        while not (self.gate.idle() and self.queue.get_tasks_remaining() == 0):
            if time.monotonic() > end:
                self.gate.move(G.OPEN, "park called off: the queue stayed busy")
                return False, f"busy: prompts still queued or running after {grace:g} s"
            await asyncio.sleep(0.05)
        await _unload(self.queue, end)
        self._budget(0)
        self.gate.move(G.ASLEEP, "parked")
        self.health = "parked"
        return True, ""

    async def wake(self) -> bool:
        """Open the gate (models load again with the next prompt). False after a drain: a
        drained ComfyUI stays refused until it restarts."""
        if self.gate.state is G.STOPPED:
            return False
        await self._sync_reservation()
        self.health = "leased"
        self.gate.move(G.OPEN, "woken")
        return True

    def status(self) -> dict:
        """What the "Berth status" node and the protocol's state route show."""
        hr = self._headroom
        return {"engine": self.engine, "lease": self.lease_id, "health": self.health,
                "reserved_bytes": self.reserved_bytes, "gate": self.gate.counters(),
                "unloading_defeated_by": self.defeated,
                "dynamic_vram": comfy.aimdo_control() is not None,
                "dynamic_vram_headroom_bytes": self.headroom_bytes,
                "dynamic_vram_setter": None if hr is None else (hr.how or hr.why)}


def ask_wake(agent: "Agent") -> None:
    """The gate holds a prompt while asleep: ask berthd to wake the agent's lease (any
    thread); berthd gone fails the gate open (ComfyUI's models were unloaded; it loads again)."""
    lid = agent.lease_id

    async def ask() -> None:
        try:
            if lid is None:
                raise BerthdUnavailable("no lease")
            # Whose prompt asks, and since when (issue 34: a holder that answered it yields).
            r = await agent._client.wake(lid, *agent.gate.asker())
            wait = r.get("wait") or {}
            if wait.get("why"):
                agent.gate.cause, agent.gate.lasting = wait["why"], bool(wait.get("lasting"))
        except (BerthdUnavailable, ApiError) as e:
            log.warning("Berth: the wake could not be asked (%s); the gate opens", e)
            agent.gate.fail_open("berthd is not reachable")
    agent.call(ask())


async def withdraw_wake(client: Client, lease_id: str) -> None:
    """Withdraw the lease's wake (``DELETE /v1/leases/{id}/wake``), so berthd makes no room
    for nobody; a park begun only for it is called off where it still can be (issue 37)."""
    try:
        r = await client.call("DELETE", f"/v1/leases/{lease_id}/wake")
        log.info("Berth: the wake was %s (no prompt waits for it any more)",
                 "withdrawn" if r.get("withdrawn") else "already under way or done")
    except (BerthdUnavailable, ApiError) as e:
        log.info("Berth: the wake could not be withdrawn: %s", e)


async def _unload(queue: Any, end: float) -> None:
    """Have ComfyUI's prompt worker unload (``queue`` is its ``PromptQueue``), never from here
    (reference "Threads"), until ``end`` (monotonic seconds). Its ``PromptQueue.get`` looks at
    no flag: set while the worker runs its gc after a prompt, the flags wake nothing (seen on
    ComfyUI 0.3.64), so they are set again until taken."""
    nudge = 0.0
    while nudge == 0.0 or "unload_models" in queue.get_flags(reset=False):
        if time.monotonic() > end:
            break                                 # berthd's driver read decides anyway
        if time.monotonic() >= nudge:             # the flag waited on last: none is left over
            queue.set_flag("free_memory", True)
            queue.set_flag("unload_models", True)
            nudge = time.monotonic() + 0.25
        await asyncio.sleep(0.02)
    while (comfy.loaded_models() or 0) > 0 and time.monotonic() < end:
        await asyncio.sleep(0.02)
