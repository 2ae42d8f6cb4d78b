"""The gate: an aiohttp middleware on ComfyUI's own app, the front for ComfyUI.

Source: seed 002 "Fronts" and rule 3; issue 13 ("add the gate ... before the app freezes");
reference/hosts.md "Routes and middleware" (a custom node may append to
``PromptServer.instance.app.middlewares`` at import time; ``add_on_prompt_handler`` cannot
veto a prompt).

Only the writes that use the card are gated: ``POST /prompt`` and ``POST /api/prompt``
(:data:`GATED`). Every other request passes untouched, whatever the state: reads never wake
ComfyUI (monitors poll ``/queue`` and ``/system_stats``), and ``/free``, ``/interrupt`` and
``/queue`` do not load models.

States (the seed's four, plus ``starting`` while the lease waits and ``off`` when the gate
passes everything: berthd down, or no lease; ``stopped`` after a drain, which answers every
gated write with a 503 at once)::

    off ──▶ starting ──▶ open ──▶ closing ──▶ asleep ──▶ waking ──▶ open
                          ▲          │
                          └──────────┘ park called off

A gated write while ``open`` passes once :meth:`Gate.before_write` (the growth check) says so.
While ``closing``, ``starting`` or ``waking`` it is held; while ``asleep`` it is held and the
first one asks for the wake (``on_wake``, once per sleep). A held write ends when the gate
opens (it passes), or with a 503 in ComfyUI's error shape naming the reason at the wait limit
or when the wake fails::

    {"error": {"type": "berth_unavailable", "message": "...", "details": "<reason>",
               "extra_info": {"src": "berth", "reason": "<reason>"}}, "node_errors": {}}

The gate also keeps when each gated write arrived (held or being handled) and, once ComfyUI
queued it, its prompt's id with that time (:meth:`Gate.arrivals`): ComfyUI's queue keeps no
arrival times, and berthd's ladder wants the oldest job's age (issue 16).

Threads: the middleware runs on ComfyUI's event loop; the node's agent changes the state from
its own thread. State lives under a lock, and a change wakes held requests through
``call_soon_threadsafe`` on the loop that serves them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Awaitable, Callable

from aiohttp import web

__all__ = ["Gate", "GATED", "STATES", "unavailable"]

log = logging.getLogger("berth.comfyui")

#: The requests the gate holds (method, path): the writes that use the card.
GATED = frozenset({("POST", "/prompt"), ("POST", "/api/prompt")})
STATES = ("off", "starting", "open", "closing", "asleep", "waking", "stopped")
_HOLDING = frozenset({"starting", "closing", "asleep", "waking"})


def unavailable(reason: str, message: str) -> web.Response:
    """A 503 in ComfyUI's ``POST /prompt`` error shape, with ``src`` and ``reason``."""
    return web.json_response(
        {"error": {"type": "berth_unavailable", "message": message, "details": reason,
                   "extra_info": {"src": "berth", "reason": reason}}, "node_errors": {}},
        status=503, headers={"Retry-After": "1"})


class Gate:
    """The gate's state and its middleware (:meth:`middleware`, to append to the app).

    ``wait_limit_s``: the longest a write is held, seconds. ``on_wake()``: called (from the
    loop, must not block) when the first write arrives while asleep. ``before_write(body)``: an
    awaitable run for each gated write while open, before it passes; it returns None to let the
    write through, or a reason string for a 503 (the growth check: berthd could not make room).
    """

    def __init__(self, wait_limit_s: float = 120.0, on_wake: Callable[[], None] | None = None,
                 before_write: Callable[[object], Awaitable[str | None]] | None = None):
        self.wait_limit_s = wait_limit_s
        self.on_wake = on_wake
        self.before_write = before_write
        self._lock = threading.Lock()
        self._state = "off"
        self.since = time.monotonic()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._fail_epoch, self._fail_reason = 0, ""
        self._wake_asked = False
        self.stop_reason = ""
        self.in_flight = 0          # gated writes being handled by ComfyUI now
        self.holding = 0
        self._arrived: dict[int, float] = {}       # writes held or handled now: arrival time
        self.queued_at: dict[str, float] = {}      # prompt id: when its write arrived
        self.passed = self.held = self.refused = self.wakes = 0

    # -- state (any thread) ----------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    def set(self, state: str, why: str = "") -> bool:
        """Move to ``state`` (one of :data:`STATES`); True when it changed."""
        if state not in STATES:
            raise ValueError(f"gate state: expected one of {', '.join(STATES)}, got {state!r}")
        with self._lock:
            old = self._state
            if old == state:
                return False
            self._state, self.since = state, time.monotonic()
            if state != "waking":
                self._wake_asked = False
        log.info("Berth gate: %s -> %s%s", old, state, f" ({why})" if why else "")
        self._notify()
        return True

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
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:        # that loop has closed
                pass

    def idle(self) -> bool:
        return self.in_flight == 0

    def arrivals(self) -> tuple[list[float], dict[str, float]]:
        """The arrival times of the writes held or handled now, and ``{prompt id: arrival
        time}`` of the writes ComfyUI queued; ``time.monotonic`` seconds (any thread)."""
        with self._lock:
            return list(self._arrived.values()), dict(self.queued_at)

    def forget(self, prompt_ids) -> None:
        """Drop the arrival times of prompts no longer queued or running."""
        with self._lock:
            for pid in prompt_ids:
                self.queued_at.pop(pid, None)

    def counters(self) -> dict:
        return {"state": self._state, "in_flight": self.in_flight, "holding": self.holding,
                "passed": self.passed, "held": self.held, "refused": self.refused,
                "wakes": self.wakes}

    # -- the middleware (ComfyUI's loop) ---------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if (request.method, request.path) not in GATED:
            return await handler(request)
        key, arrived = id(request), time.monotonic()
        with self._lock:
            self._arrived[key] = arrived
        try:
            refusal = await self._admit(request)
            if refusal is not None:
                return refusal
            with self._lock:
                self.in_flight += 1
            try:
                resp = await handler(request)
                pid = _prompt_id(resp)
                if pid is not None:
                    with self._lock:
                        self.queued_at[pid] = arrived
                return resp
            finally:
                with self._lock:
                    self.in_flight -= 1
                self._notify()
        finally:
            with self._lock:
                self._arrived.pop(key, None)

    async def _admit(self, request: web.Request) -> web.Response | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_limit_s
        epoch = self._fail_epoch
        counted = False
        ev = asyncio.Event()
        key = (loop, ev)
        with self._lock:
            self._waiters.add(key)
        try:
            while True:
                ev.clear()
                st = self._state
                if self._fail_epoch != epoch:
                    self.refused += 1
                    return unavailable(self._fail_reason, f"ComfyUI is unavailable: "
                                                          f"{self._fail_reason}")
                if st == "stopped":
                    self.refused += 1
                    return unavailable("stopped", f"ComfyUI is not leased: {self.stop_reason}")
                if st in ("off", "open"):
                    why = await self._check(request) if st == "open" else None
                    if why is None:
                        self.passed += 1
                        return None
                    self.refused += 1
                    return unavailable(why, f"Berth could not make room for this prompt: {why}")
                if not counted:
                    counted = True
                    self.held += 1
                    self.holding += 1
                if st == "asleep":
                    self._ask_wake()
                left = deadline - loop.time()
                if left <= 0:
                    self.refused += 1
                    return unavailable("wait_limit", f"ComfyUI was not ready within the wait "
                                       f"limit ({self.wait_limit_s:g} s, gate {self._state}); "
                                       "the prompt was held and not queued")
                try:
                    await asyncio.wait_for(ev.wait(), left)
                except TimeoutError:
                    pass
        finally:
            with self._lock:
                self._waiters.discard(key)
            if counted:
                self.holding -= 1

    async def _check(self, request: web.Request) -> str | None:
        if self.before_write is None:
            return None
        try:
            body = await request.json()           # aiohttp keeps the body for the handler
        except Exception:
            return None                           # ComfyUI answers a bad body itself
        try:
            return await self.before_write(body.get("prompt") if isinstance(body, dict) else None)
        except Exception as e:                    # the check must never break ComfyUI
            log.warning("Berth: the growth check failed (%s); the prompt passes", e)
            return None

    def _ask_wake(self) -> None:
        with self._lock:
            if self._wake_asked or self._state != "asleep":
                return
            self._wake_asked = True
            self._state, self.since = "waking", time.monotonic()
            self.wakes += 1
        log.info("Berth gate: asleep -> waking (a prompt arrived)")
        if self.on_wake is not None:
            try:
                self.on_wake()
            except Exception as e:
                log.warning("Berth: asking for the wake failed: %s", e)
                self.set("asleep", f"wake failed: {e}")
                self.fail_held(f"wake failed: {e}")


def _prompt_id(resp) -> str | None:
    """The prompt id in ComfyUI's answer to a queued prompt (``{"prompt_id": ...}``), or None."""
    if getattr(resp, "status", None) != 200 or not isinstance(getattr(resp, "body", None), bytes):
        return None
    try:
        pid = json.loads(resp.body).get("prompt_id")
    except (ValueError, AttributeError):
        return None
    return str(pid) if pid is not None else None
