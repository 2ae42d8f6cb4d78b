"""The :class:`Front` itself: its states and lifetime (the request path is
:class:`berth.front.path.RequestPath`; the module docstring of :mod:`berth.front` gives the
whole contract)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable

from yarl import URL

from .clients import ClientLog
from .closing import Closing
from .fast import FastPath
from .listen import Limits, Listener
from .rules import EDGES, TRANSITIONS, FrontState, IllegalFrontTransition, default_is_write
from .server import ClientConnection
from .upstream import Address, Pool

log = logging.getLogger("berth.front")
F = FrontState


class Front(Closing, FastPath):
    """A reverse proxy for one engine with the states of seed 002 "Fronts".

    ``host``/``port``: the front's address (``port=0`` picks one; read :attr:`port` after
    :meth:`start`). ``name``: the engine's name, used in messages. ``wait_limit_s``: the longest
    a request is held, seconds. ``on_wake``: awaited once per sleep when the first write arrives
    while asleep. ``on_activity``: called when a request is forwarded, at most once per
    ``activity_every_s`` seconds. ``on_state(old, new, why)``: called on every transition.
    ``is_write(method, path)``: True when a request needs the engine awake (default: any method
    but GET, HEAD and OPTIONS).
    ``shutdown_grace_s``: how long :meth:`stop` lets in-flight requests finish, seconds.
    ``max_in_flight``: the most writes forwarded at once (the engine's slots; ``None``: no
    limit; :meth:`set_max_in_flight` changes it, e.g. once the run has measured them, issue 34).
    Further writes are held in the front in arrival order (the hold of a sleeping engine's
    writes: its keep-alive and wait limit), not in the engine's own queue, so a park waits only
    for what the engine is running, and what waits stays held across the park.
    ``on_unwanted``: called when the last held request leaves (answered at its deadline, or its
    client gone) while the front is ``waking``: nobody waits for that wake any more.
    ``limits``: what the front allows its clients (:class:`berth.front.listen.Limits`: a request
    head within 10 s, an idle kept-alive connection 60 s, connections bounded by the file
    descriptor limit).

    Counters (plain ints): ``forwarded`` requests sent to the engine, ``served`` those of them
    that are not reads by method (GET, HEAD, OPTIONS; model requests started, never less than
    before: ``berth run`` reports it per lease, issue 24), ``held`` requests that
    waited, ``held_timeouts`` held requests answered 503 at a deadline, ``client_gone`` clients
    that disconnected before their answer was complete, ``errors`` engine failures (502s and
    streams cut mid-way), ``refused_reads`` reads answered 503 while not open, ``wakes`` calls of
    ``on_wake``. ``in_flight``: requests being forwarded now.
    """

    def __init__(self, host: str, port: int, *, name: str = "engine", wait_limit_s: float = 120.0,
                 on_wake: Callable[[], Awaitable[None]] | None = None,
                 on_activity: Callable[[], None] | None = None,
                 on_state: Callable[[FrontState, FrontState, str], None] | None = None,
                 is_write: Callable[[str, str], bool] | None = None,
                 activity_every_s: float = 1.0, shutdown_grace_s: float = 2.0,
                 max_in_flight: int | None = None,
                 on_unwanted: Callable[[], None] | None = None,
                 limits: Limits | None = None):
        if wait_limit_s <= 0:
            raise ValueError(f"wait_limit_s must be positive, got {wait_limit_s}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._on_unwanted = on_unwanted
        self.host, self.port, self.name = host, port, name
        self.wait_limit_s = wait_limit_s
        self.activity_every_s = activity_every_s
        self._on_wake, self._on_activity, self._on_state = on_wake, on_activity, on_state
        self._is_write = is_write or default_is_write
        self._shutdown_grace_s = shutdown_grace_s
        self._state = F.STARTING
        self.since = time.monotonic()           # when the current state began (monotonic s)
        self._upstream: str | None = None       # base URL without a trailing slash
        self._changed = asyncio.Event()         # replaced on every change; held requests wait on it
        self._fail_epoch, self._fail_reason = 0, ""
        self._stop_reason = "engine stopped"
        self.cause: str | None = None           # why the engine's lease waits (berthd's words)
        # The engine's true state while the front sleeps, when it is not "parked": "drained"
        # (its process stopped). A health read says it to monitors (issue 37).
        self.engine_state: str | None = None
        self.lasting = False                    # nothing under way can end that wait
        self._idle = asyncio.Event()            # set while in_flight == 0
        self._idle.set()
        self._wake_tasks: set[asyncio.Task[None]] = set()
        self._addr: Address | None = None
        self._pool = Pool()
        self.listener = Listener(self, host, port, name=f"front {name}", pool=self._pool,
                                 limits=limits)
        self._last_activity = float("-inf")
        self.in_flight = self._holding = 0
        self._arrived: dict = {}                # request -> when it reached the front (monotonic s)
        self._line: collections.deque = collections.deque()   # held requests, in arrival order
        # A fenced close (issue 34): while a request that arrived before this time (monotonic
        # s) is held or forwarded, the front stays open; set when none is left.
        self._fence: float | None = None
        self._fenced = asyncio.Event()
        self._fence_why = ""
        self.clients = ClientLog()              # who its requests are from (issue 34)
        self.forwarded = self.served = 0
        self.held = self.held_timeouts = self.client_gone = self.errors = 0
        self.refused_reads = self.wakes = 0

    # ---- lifetime --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on the front's address, in state ``starting``. Raises ``OSError`` if the address
        is taken."""
        await self.listener.start()
        self.port = self.listener.port

    async def stop(self) -> None:
        """Shut the front down:

        1. move to ``stopped`` (reason "front stopped" unless already stopped): every held
           request is answered 503 at once;
        2. cancel a wake in progress;
        3. stop listening and give requests being answered ``shutdown_grace_s`` to finish;
        4. close every client connection and every idle engine connection.
        """
        if self._state is not F.STOPPED:
            self.stopped("front stopped")
        for task in list(self._wake_tasks):
            task.cancel()
        server = self.listener.close()
        if server is None:
            return
        busy = {c.task for c in self._conns if c.task is not None}
        try:
            async with asyncio.timeout(self._shutdown_grace_s):
                if busy:
                    await asyncio.wait(busy)
                await self._idle.wait()   # task-free forwards too
        except TimeoutError:
            pass
        self.listener.close_clients()
        await self.listener.wait_closed(server)
        self._pool.close()

    @property
    def _conns(self) -> set[ClientConnection]:
        """The client connections open now."""
        return self.listener.conns

    @property
    def url(self) -> str:
        """The front's base URL, e.g. ``http://127.0.0.1:5800``."""
        return f"http://{self.host}:{self.port}"

    @property
    def upstream(self) -> str | None:
        """The engine's base URL, or None before :meth:`set_upstream`."""
        return self._upstream

    def set_upstream(self, url: str) -> None:
        """Send requests to ``url`` (``http://HOST:PORT``, optionally with a path prefix) from now
        on. May be called in any state; requests already forwarded keep their connection."""
        addr = Address(url)
        if self._addr is not None and self._addr.key != addr.key:
            self._pool.close()   # idle connections to the old address serve nobody now
        self._addr, self._upstream = addr, str(URL(url)).rstrip("/")

    # ---- states ----------------------------------------------------------------------------------

    @property
    def state(self) -> FrontState:
        """The current state."""
        return self._state

    @property
    def oldest_client(self) -> str | None:
        """The client key (:mod:`.clients`) of the oldest model request held or forwarded now
        (``None``: none, or its client has no address)."""
        return self.clients.oldest(self._arrived)

    @property
    def holding(self) -> int:
        """Requests held now."""
        return self._holding

    def _move(self, new: FrontState, why: str = "") -> bool:
        """The only place the state changes: check the edge, record the time, wake every held
        request, emit one event. Moving to the current state does nothing and returns False."""
        old = self._state
        if new is old:
            return False
        edge = EDGES.get((old, new))
        if edge is None:
            raise IllegalFrontTransition(
                f"front {self.name!r}: {old} -> {new} is not allowed; from {old} it may go to "
                f"{', '.join(sorted(TRANSITIONS[old])) or 'nowhere'}")
        self._state, self.since = new, time.monotonic()
        if self._fence is not None and new is not F.OPEN:
            # Out of open by another way (stopped): a fenced close's wait ends with it.
            self._fence = None
            self._fenced.set()
        if new not in (F.ASLEEP, F.WAKING):
            self.engine_state = None
        self._notify()
        log.info("front %s: %s -> %s (%s)", self.name, old, new, why or edge)
        if self._on_state is not None:
            try:
                self._on_state(old, new, why or edge)
            except Exception:
                log.exception("front %s: on_state callback failed", self.name)
        return True

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def starting(self) -> bool:
        """``stopped -> starting``: the run starts the engine again (writes held, reads 503)."""
        return self._move(F.STARTING)

    def open(self) -> bool:
        """Forward from now on; held requests are forwarded. Raises
        :class:`IllegalFrontTransition` from ``asleep`` (go through :meth:`waking`) or ``stopped``,
        and ``RuntimeError`` before :meth:`set_upstream`."""
        if self._upstream is None:
            raise RuntimeError(f"front {self.name!r}: set_upstream() before open()")
        self._fence = None      # a fenced close called off
        return self._move(F.OPEN)

    def sleep(self, engine: str | None = None) -> bool:
        """``closing -> asleep`` (or ``waking -> asleep`` when a wake is refused). Writes held
        from now on, or already held, make the front ask for the card through ``on_wake``.
        ``engine``: the engine's state when it is not parked (``"drained"``: its process
        stopped), which health reads give monitors (issue 37)."""
        moved = self._move(F.ASLEEP)
        self.engine_state = engine
        return moved

    def waking(self) -> bool:
        """``asleep -> waking``: the broker resumes the lease on its own (no ``on_wake`` call)."""
        return self._move(F.WAKING)

    def stopped(self, reason: str = "engine stopped") -> bool:
        """Move to ``stopped``: every held request and every new one is answered 503 with
        ``reason``. :meth:`starting` leaves it."""
        self._stop_reason = reason
        self.fail_held(reason)
        return self._move(F.STOPPED, reason)

    def set_cause(self, cause: str | None, lasting: bool = False) -> None:
        """Why the engine's lease (or its wake) waits, as berthd says it (issue 12 case 6): a
        held request's 503 names it. ``lasting``: nothing under way can end the wait, so a held
        write is answered at once (reason ``no_room``), unless its client asked to wait with
        ``X-Berth-Deadline``."""
        self.cause, self.lasting = cause, bool(cause) and lasting
        self._notify()

    def set_max_in_flight(self, n: int | None) -> None:
        """Forward at most ``n`` writes at once from now on (``None``: every one). Held writes
        look again at once (a raised limit lets them go). Raises ``ValueError`` when ``n`` < 1."""
        if n is not None and n < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {n}")
        self.max_in_flight = n
        self._notify()

    def fail_held(self, reason: str) -> int:
        """Answer every request held now with a 503 naming ``reason``; requests that arrive later
        are held as the state says. Returns how many were held."""
        self._fail_epoch += 1
        self._fail_reason = reason
        self._notify()
        return self._holding

    def counters(self) -> dict[str, int | str]:
        """The state and counters, for ``berth status``."""
        return {"state": str(self._state), "in_flight": self.in_flight, "holding": self._holding,
                "forwarded": self.forwarded, "served": self.served, "held": self.held,
                "held_timeouts": self.held_timeouts, "client_gone": self.client_gone,
                "errors": self.errors, "refused_reads": self.refused_reads, "wakes": self.wakes}

    def _arrive(self, req) -> None:
        """A write is held: when it came, and from whom (issue 34)."""
        self._arrived.setdefault(req, time.monotonic())
        self.clients.came(req)

    def _unheld(self, req) -> None:
        """A held write leaves without being forwarded."""
        self._arrived.pop(req, None)
        self.clients.left(req, False, False)
        self._fence_check()

    def _ask_wake(self) -> None:
        if self._on_wake is None:
            return   # nobody to ask: the request waits for the caller or its deadline
        self._move(F.WAKING, "a write arrived while asleep")
        self.wakes += 1
        task = asyncio.get_running_loop().create_task(self._wake(self._on_wake))
        self._wake_tasks.add(task)
        task.add_done_callback(self._wake_tasks.discard)

    async def _wake(self, on_wake: Callable[[], Awaitable[None]]) -> None:
        try:
            await on_wake()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"wake failed: {exc or type(exc).__name__}"
            log.warning("front %s: %s", self.name, reason)
            if self._state is F.WAKING:
                self._move(F.ASLEEP, reason)
            self.fail_held(reason)
