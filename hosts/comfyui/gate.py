"""The gate: an aiohttp middleware on ComfyUI's own app, the front for ComfyUI.

Source: seed 002 "Fronts" and rule 3; issue 13 ("add the gate ... before the app freezes");
issue 28 ("a held prompt says why in ComfyUI"); reference/hosts.md "Routes and middleware" (a
custom node may append to ``PromptServer.instance.app.middlewares`` at import time;
``add_on_prompt_handler`` cannot veto a prompt).

Only the writes that use the card are gated: ``POST /prompt`` and ``POST /api/prompt``
(:data:`GATED`). Every other request passes untouched, whatever the state: reads never wake
ComfyUI (monitors poll ``/queue`` and ``/system_stats``), and ``/free``, ``/interrupt`` and
``/queue`` do not load models.

States and their edges are data (:mod:`.states`); :meth:`Gate.move` is the only place the state
changes: it checks the edge, records the time, wakes every held write and logs the edge.

A gated write while ``open`` passes once :meth:`Gate.before_write` (the growth check) says so.
While ``closing``, ``starting`` or ``waking`` it is held; while ``asleep`` it is held and the
first one asks for the wake (``on_wake``, once per sleep). While held, the prompt's page is
told why every ``notice_every_s`` (``on_notice(body, text)``, :mod:`.notice`: "waiting for the
card: <berthd's reason> (waited N s; about M s more)"). A held write ends when the gate opens
(it passes), when its client goes away, or with a 503 in ComfyUI's error shape naming the
reason at the wait limit or when the wake fails::

    {"error": {"type": "berth_unavailable", "message": "...", "details": "<reason>",
               "extra_info": {"src": "berth", "reason": "<reason>"}}, "node_errors": {}}

The gate also keeps when each gated write arrived (held or being handled) and, once ComfyUI
queued it, its prompt's id with that time (:meth:`Gate.arrivals`): ComfyUI's queue keeps no
arrival times, and berthd's ladder wants the oldest job's age (issue 16).

Threads: the middleware runs on ComfyUI's event loop; the node's agent moves the state from
its own thread. State lives under a lock, and a move wakes held requests through
``call_soon_threadsafe`` on the loop that serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from berth.front.clients import peer_key
from berth.front.rules import RETRY_AFTER_S, RETRY_LASTING_S

from .notice import Teller, WaitMeter
from .states import EDGES, PASSING, TRANSITIONS, GateState, IllegalGateTransition

__all__ = ["Gate", "GATED", "GateState", "unavailable"]

log = logging.getLogger("berth.comfyui")

G = GateState

#: The requests the gate holds (method, path): the writes that use the card.
GATED = frozenset({("POST", "/prompt"), ("POST", "/api/prompt")})
#: The requests that take a prompt back (ComfyUI 0.3.64 ``server.py``): ``/queue`` with
#: ``{"delete": [prompt ids]}`` or ``{"clear": true}``, and ``/interrupt`` (``{"prompt_id"}``, or
#: none: the prompt running now). They pass to ComfyUI as ever; a held prompt they name is
#: answered first, and so its wake withdrawn (issue 37).
TAKE_BACK = frozenset({("POST", "/queue"), ("POST", "/api/queue"), ("POST", "/interrupt"),
                       ("POST", "/api/interrupt")})

_NOT_STOPPED = frozenset(GateState) - {G.STOPPED}
_ASLEEP, _WAKING = frozenset({G.ASLEEP}), frozenset({G.WAKING})

#: How often a held write looks at its client and tells its page why it waits (seconds).
_TICK_S = 0.5


def unavailable(reason: str, message: str, retry_after_s: int = RETRY_AFTER_S) -> web.Response:
    """A 503 in ComfyUI's ``POST /prompt`` error shape, with ``src`` and ``reason``;
    ``Retry-After: retry_after_s`` (seconds: 1, or :data:`~berth.front.rules.RETRY_LASTING_S`
    when nothing under way can end the wait, as the run's front says)."""
    return web.json_response(
        {"error": {"type": "berth_unavailable", "message": message, "details": reason,
                   "extra_info": {"src": "berth", "reason": reason}}, "node_errors": {}},
        status=503, headers={"Retry-After": str(retry_after_s)})


def _gone(request: web.Request) -> bool:
    """The client closed its connection (aiohttp clears the transport on connection_lost)."""
    t = request.transport
    return t is None or t.is_closing()


class _Askers:
    """When the gated writes and queued prompts arrived and who asked (issue 34), mixed into
    :class:`Gate`, which provides the lock and the records: a client key per write held or
    handled now (``_who``) and per queued prompt (``queued_by``), and who got the last prompt
    that left the queue, and when (``answered``)."""

    _lock: threading.Lock
    _arrived: dict[int, float]
    _who: dict[int, str | None]
    queued_at: dict[str, float]
    queued_by: dict[str, str | None]
    answered: tuple[str | None, float | None]

    def forget(self, prompt_ids) -> None:
        """Drop the arrival times of prompts no longer queued or running: each is answered
        now (its client has its images, or its error), the last one seen gone for the
        client it answered."""
        with self._lock:
            for pid in prompt_ids:
                self.queued_at.pop(pid, None)
                if pid in self.queued_by:
                    self.answered = (self.queued_by.pop(pid), time.monotonic())

    def arrivals(self) -> tuple[list[float], dict[str, float]]:
        """The arrival times of the writes held or handled now, and ``{prompt id: arrival
        time}`` of the writes ComfyUI queued; ``time.monotonic`` seconds (any thread)."""
        with self._lock:
            return list(self._arrived.values()), dict(self.queued_at)

    def clients(self) -> tuple[str | None, str | None, float | None]:
        """``(oldest, answered, answered_at)`` as :class:`berth.client.JobReporter` reports
        them: the client key of the oldest write held or handled or prompt queued, and who
        got the last answer and when (``time.monotonic`` seconds; ``None``: not known)."""
        with self._lock:
            times = [(t, self._who.get(k)) for k, t in self._arrived.items()]
            times += [(t, self.queued_by.get(pid)) for pid, t in self.queued_at.items()]
            oldest = min(times, key=lambda x: x[0])[1] if times else None
            return (oldest, *self.answered)

    def asker(self) -> tuple[str | None, float | None]:
        """The client key of the oldest write held now and its age (seconds), for the wake
        it asks for (:meth:`berth.client.Client.wake`)."""
        with self._lock:
            if not self._arrived:
                return None, None
            key, at = min(self._arrived.items(), key=lambda x: x[1])
            return self._who.get(key), time.monotonic() - at


class Gate(_Askers):
    """The gate's state and its middleware (:meth:`middleware`, to append to the app).

    ``wait_limit_s``: the longest a write is held, seconds. ``on_wake()``: called (from the
    loop, must not block) when the first write arrives while asleep. ``before_write(body)``: an
    awaitable run for each gated write while open, before it passes, with the request's JSON
    body; it returns None to let the write through, or a reason string for a 503 (the growth
    check: berthd could not make room); cancelled when the client goes away.
    ``on_notice(body, text)``: tells the prompt's page why it waits (any thread, must not
    block). ``cause``: berthd's words for why the lease waits, set by the agent; ``lasting``:
    nothing under way can end that wait (berthd's ``wait.lasting``), so a write refused for
    the wait gets ``Retry-After: 30`` (:data:`~berth.front.rules.RETRY_LASTING_S`), not 1.
    ``on_unwanted()``: called (any thread, must not block) when every write that asked for a
    wake has gone (deleted, interrupted, its client left, refused at the wait limit): the
    agent withdraws the wake, and the gate is ``asleep`` again (issue 37).
    """

    def __init__(self, wait_limit_s: float = 120.0, on_wake: Callable[[], None] | None = None,
                 before_write: Callable[[Any], Awaitable[str | None]] | None = None,
                 on_notice: Callable[[Any, str], None] | None = None,
                 notice_every_s: float = 2.0,
                 on_unwanted: Callable[[], None] | None = None):
        self.wait_limit_s = wait_limit_s
        self.on_unwanted = on_unwanted
        self.on_wake, self.before_write, self.on_notice = on_wake, before_write, on_notice
        self.notice_every_s = notice_every_s
        self._lock = threading.Lock()
        self._state = G.OFF
        self.since = time.monotonic()
        self.cause: str | None = None
        self.lasting = False
        self.waits = WaitMeter()                   # how long held writes waited
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._fail_epoch, self._fail_reason = 0, ""
        self.stop_reason = ""
        self.in_flight = 0          # gated writes being handled by ComfyUI now
        self.holding = 0
        self._arrived: dict[int, float] = {}       # writes held or handled now: arrival time
        self.back = TakenBack()                    # held writes a /queue or /interrupt named
        self.queued_at: dict[str, float] = {}      # prompt id: when its write arrived
        # Who asked (issue 34): a client key per write held or handled now and per queued
        # prompt, and who got the last prompt that left the queue, and when (monotonic s).
        self._who: dict[int, str | None] = {}
        self.queued_by: dict[str, str | None] = {}
        self.answered: tuple[str | None, float | None] = (None, None)
        self.passed = self.held = self.refused = self.wakes = self.client_gone = 0

    # -- state (any thread) ----------------------------------------------------------------
    @property
    def state(self) -> GateState:
        return self._state

    def move(self, new: GateState, why: str = "",
             only_from: frozenset[GateState] | None = None) -> bool:
        """The only place the state changes: check the edge (:data:`~.states.EDGES`), record
        the time, wake every held write, log the edge. Moving to the current state, or from a
        state not in ``only_from`` (checked under the same lock: another thread may have moved
        the gate), does nothing and returns False. Raises
        :class:`~.states.IllegalGateTransition` for an edge the table lacks."""
        new = GateState(new)
        with self._lock:
            old = self._state
            if new is old or (only_from is not None and old not in only_from):
                return False
            edge = EDGES.get((old, new))
            if edge is None:
                raise IllegalGateTransition(
                    f"gate: {old} -> {new} is not allowed; from {old} it may go to "
                    f"{', '.join(sorted(TRANSITIONS[old])) or 'nowhere'}")
            self._state, self.since = new, time.monotonic()
        self._notify()
        log.info("Berth gate: %s -> %s (%s)", old, new, why or edge)
        return True

    def fail_open(self, why: str) -> bool:
        """Pass everything from now on (berthd down, no lease), unless drained: a stopped gate
        stays stopped. True when the state changed."""
        return self.move(G.OFF, why, only_from=_NOT_STOPPED)

    def stop(self, why: str) -> None:
        """Drained: answer every gated write, held now or to come, with a 503 naming ``why``."""
        self.stop_reason = why
        self.move(G.STOPPED, "drained")
        self.fail_held(why)

    def fail_held(self, reason: str) -> None:
        """Answer every write held now with a 503 naming ``reason``."""
        with self._lock:
            self._fail_epoch += 1
            self._fail_reason = reason
        self._notify()

    def _notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, ev in waiters:
            with contextlib.suppress(RuntimeError):     # that loop has closed
                loop.call_soon_threadsafe(ev.set)

    def idle(self) -> bool:
        return self.in_flight == 0

    def counters(self) -> dict:
        return {"state": self._state.value, "in_flight": self.in_flight,
                "holding": self.holding, "passed": self.passed, "held": self.held,
                "refused": self.refused, "wakes": self.wakes, "client_gone": self.client_gone}

    def why_held(self) -> str:
        """Why a write is held now, in words (berthd's, where the agent has them)."""
        st, cause = self._state, f": {self.cause}" if self.cause else ""
        if st is G.STARTING:
            return f"ComfyUI's lease waits for room{cause}"
        if st is G.CLOSING:
            return "ComfyUI is being parked for another engine; the prompt runs after the wake"
        return f"ComfyUI is parked and being woken{cause}"

    # -- the middleware (ComfyUI's loop) ---------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if (request.method, request.path) in TAKE_BACK:
            route = request.path.rsplit("/", 1)[1]
            with contextlib.suppress(Exception):     # ComfyUI answers a bad body itself
                if self.back.take(route, await _take_back_body(request, route), self._state):
                    self._notify()
            return await handler(request)
        if (request.method, request.path) not in GATED:
            return await handler(request)
        key, arrived = id(request), time.monotonic()
        who = peer_key(request.transport.get_extra_info("peername")
                       if request.transport is not None else None,
                       request.headers.getall("X-Forwarded-For", []))
        with self._lock:
            self._arrived[key] = arrived
            self._who[key] = who
        try:
            try:
                body = await request.json()       # aiohttp keeps the body for the handler
            except Exception:
                body = None                       # ComfyUI answers a bad body itself
            refusal = await self._admit(request, body)
            if refusal is not None:
                return refusal
            return await self._handle(request, handler, arrived)
        finally:
            with self._lock:
                self._arrived.pop(key, None)
                self._who.pop(key, None)

    async def _handle(self, request: web.Request, handler, arrived: float):
        with self._lock:
            self.in_flight += 1
        try:
            resp = await handler(request)
            pid = _prompt_id(resp)
            if pid is not None:
                with self._lock:
                    self.queued_at[pid] = arrived
                    self.queued_by[pid] = self._who.get(id(request))
            return resp
        finally:
            with self._lock:
                self.in_flight -= 1
            self._notify()

    async def _admit(self, request: web.Request, body: Any) -> web.Response | None:
        """Hold the write until the gate passes it (None) or refuses it (a 503)."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        deadline, epoch = arrived + self.wait_limit_s, self._fail_epoch
        ev = asyncio.Event()
        key, held = (loop, ev), False
        told = Teller(lambda text: self._say(body, text), self.notice_every_s)
        with self._lock:
            self._waiters.add(key)
        try:
            while True:
                ev.clear()
                st = self._state
                refusal = self._refusal(epoch, st) or self._taken_back(key)
                if refusal is not None:
                    return refusal
                if st in PASSING:
                    return await self._pass(request, body, st, held, loop.time() - arrived,
                                            told)
                if not held:
                    held, self.held, self.holding = True, self.held + 1, self.holding + 1
                    self.back.hold(key, body)
                if st is G.ASLEEP:
                    self._ask_wake()
                if loop.time() >= deadline:
                    return self._refuse("wait_limit", f"ComfyUI was not ready within the wait "
                                        f"limit ({self.wait_limit_s:g} s, gate {self._state}); "
                                        "the prompt was held and not queued",
                                        lasting=self._lasting())
                if _gone(request):
                    self.client_gone += 1
                    return self._refuse("client_gone", "the client went away while held")
                waited = loop.time() - arrived
                told.tell(self.why_held(), waited, self.waits.expected(waited))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), min(deadline - loop.time(), _TICK_S))
        finally:
            with self._lock:
                self._waiters.discard(key)
                self.back.drop(key)
            if held:
                self.holding -= 1
                self._after_held()

    def _taken_back(self, key: tuple) -> web.Response | None:
        why = self.back.why(key)
        return None if why is None else self._refuse(
            why, f"the prompt was {why} while Berth held it; it was not queued")

    def _after_held(self) -> None:
        """A held write left: the last one gone while a wake is asked withdraws the wake
        (a prompt that passes finds the gate open, not waking)."""
        if self.holding > 0 or self._state is not G.WAKING:
            return
        if self.move(G.ASLEEP, "every prompt that asked for the wake has gone",
                     only_from=_WAKING) and self.on_unwanted is not None:
            try:
                self.on_unwanted()
            except Exception as e:
                log.warning("Berth: withdrawing the wake failed: %s", e)

    def _refusal(self, epoch: int, st: GateState) -> web.Response | None:
        if self._fail_epoch != epoch:
            return self._refuse(self._fail_reason,
                                f"ComfyUI is unavailable: {self._fail_reason}")
        if st is G.STOPPED:
            return self._refuse("stopped", f"ComfyUI is not leased: {self.stop_reason}")
        return None

    def _refuse(self, reason: str, message: str, lasting: bool = False) -> web.Response:
        self.refused += 1
        return unavailable(reason, message, RETRY_LASTING_S if lasting else RETRY_AFTER_S)

    def _lasting(self) -> bool:
        """Whether the wait a write is refused for is lasting: berthd said so of its cause (a
        retry every second would only loop, as the run's front answers a lasting no_room)."""
        return self.lasting and bool(self.cause)

    async def _pass(self, request: web.Request, body: Any, st: GateState, held: bool,
                    waited_s: float, told: Teller) -> web.Response | None:
        """The gate passes the write: the growth check first while open."""
        why = await self._check(request, body) if st is G.OPEN else None
        if why == "client_gone":
            self.client_gone += 1
            return self._refuse(why, "the client went away while berthd made room")
        if why is not None:
            return self._refuse(why, f"Berth could not make room for this prompt: {why}",
                                lasting=self._lasting())
        if held:
            self.waits.record(waited_s)
            told.ready(waited_s)
        self.passed += 1
        return None

    async def _check(self, request: web.Request, body: Any) -> str | None:
        """The growth check, called off when the client goes away (its request for room is
        then withdrawn by the agent)."""
        if self.before_write is None:
            return None
        task = asyncio.ensure_future(self.before_write(body))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_TICK_S)
                if done:
                    return task.result()
                if _gone(request):
                    task.cancel()
                    return "client_gone"
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:                    # the check must never break ComfyUI
            log.warning("Berth: the growth check failed (%s); the prompt passes", e)
            return None

    def _say(self, body: Any, text: str) -> None:
        if self.on_notice is not None:
            try:
                self.on_notice(body, text)
            except Exception as e:
                log.warning("Berth: telling the page why failed: %s", e)

    def _ask_wake(self) -> None:
        """The first write held while asleep asks for the wake: once per sleep, as the move to
        ``waking`` happens once."""
        if not self.move(G.WAKING, "a prompt arrived", only_from=_ASLEEP):
            return
        self.wakes += 1
        if self.on_wake is not None:
            try:
                self.on_wake()
            except Exception as e:
                log.warning("Berth: asking for the wake failed: %s", e)
                self.move(G.ASLEEP, f"wake failed: {e}", only_from=_WAKING)
                self.fail_held(f"wake failed: {e}")


class TakenBack:
    """The writes the gate holds now, by the prompt id a client chose for each (ComfyUI 0.3.64
    keeps it), and those a ``/queue`` or ``/interrupt`` took back while held, with the reason
    their 503 gives (issue 37). Any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[tuple, str | None] = {}
        self._taken: dict[tuple, str] = {}
        self.count = 0

    def hold(self, key: tuple, body: Any) -> None:
        pid = body.get("prompt_id") if isinstance(body, dict) else None
        with self._lock:
            self._ids[key] = str(pid) if pid else None

    def drop(self, key: tuple) -> None:
        with self._lock:
            self._ids.pop(key, None)
            self._taken.pop(key, None)

    def why(self, key: tuple) -> str | None:
        return self._taken.get(key)

    def take(self, route: str, body: Any, state: GateState) -> bool:
        """Mark the held writes the body names (:func:`taken_back_by`); True for any."""
        found = taken_back_by(route, body, state)
        if found is None:
            return False
        match, why = found
        with self._lock:
            hits = [k for k, pid in self._ids.items() if k not in self._taken and match(pid)]
            for k in hits:
                self._taken[k] = why
            self.count += len(hits)
        if hits:
            log.info("Berth: %d held prompt(s) %s while held (POST /%s)", len(hits), why, route)
        return bool(hits)


async def _take_back_body(request: web.Request, route: str) -> Any:
    """The body of a ``POST /queue`` or ``/interrupt`` as ComfyUI 0.3.64's handler reads it:
    JSON; for ``/interrupt`` no body, or one that is not JSON, is ``{}`` (a global interrupt).
    Raises where ComfyUI's handler does (its answer is then a 500, and nothing is taken back)."""
    try:
        return await request.json()             # aiohttp keeps the body for the handler
    except json.JSONDecodeError:
        if route == "interrupt":
            return {}
        raise


def taken_back_by(route: str, body: Any, state: GateState):
    """``(match(prompt_id) -> bool, reason)`` for the held prompts a ``POST /queue`` or
    ``POST /interrupt`` body takes back (``route``: ``"queue"`` or ``"interrupt"``), or
    ``None``. ComfyUI 0.3.64's own semantics (server.py): ``delete`` by prompt id, ``clear``
    every pending prompt, ``interrupt`` the named prompt, or with no id the one that runs:
    while ComfyUI sleeps (``asleep``, ``waking``) that is the held one, nothing of ComfyUI's own
    running. Prompt ids are strings compared as given (a ``5`` names no prompt ``"5"``); a body
    that is not a JSON object, or a ``delete`` of null, makes ComfyUI answer 500 and takes
    nothing back (a ``clear`` before it still wipes)."""
    if not isinstance(body, dict):
        return None
    if route == "queue":
        if body.get("clear"):
            return (lambda pid: True), "cleared"
        listed = body.get("delete")
        ids = {x for x in listed if isinstance(x, str)} if isinstance(listed, list) else set()
        return (lambda pid: pid in ids), "deleted"
    named = body.get("prompt_id")
    if named:
        return (lambda pid: pid == named), "interrupted"
    if state in (G.ASLEEP, G.WAKING):
        return (lambda pid: True), "interrupted"
    return None


def _prompt_id(resp) -> str | None:
    """The prompt id in ComfyUI's answer to a queued prompt (``{"prompt_id": ...}``), or None."""
    if getattr(resp, "status", None) != 200 or not isinstance(getattr(resp, "body", None), bytes):
        return None
    try:
        pid = json.loads(resp.body).get("prompt_id")
    except (ValueError, AttributeError):
        return None
    return str(pid) if pid is not None else None
