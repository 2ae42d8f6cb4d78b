"""The stub engine: an OpenAI-style server that allocates on a simulated card.

Source: issue 3 "the stub engine"; DESIGN.md "The Berth engine protocol"; reference
"llama.cpp server" (``/health``) and "vLLM sleep mode" (error bodies). Run as
``berth sim engine --port P --weights SIZE [...]`` (flags: :func:`berth.sim.cli.engine_arguments`).

Memory on its card, in bytes: the context (``--residual``, allocated first and kept by a park),
the weights (allocated over ``--load-s`` seconds) and the KV cache. Without ``--kv-pool`` the KV
cache grows in blocks of 16 tokens as requests need it (prompt and generated tokens, each
``--kv-per-token`` bytes) and is never given back to the card: driver-visible use is a high-water
mark, as with PyTorch's caching allocator. With ``--kv-pool`` the pool is preallocated after the
weights (as vLLM does) and a request that fills it stops with ``finish_reason = "length"``.

Held loads and requests (test knobs): with ``--load-hold PATH`` a load that has allocated all that
does not finish while the file PATH exists; the engine stays "Loading model" (``/health`` 503)
until the file is removed. With ``--token-hold PATH`` a request that has generated its first token
generates no more while PATH exists (it keeps its slot and its KV). The file is looked for every
50 ms. A test holds a load or a job open until it has seen what happens meanwhile (a move by
restart, a waiter told why) rather than choosing a ``--load-s`` or a job long enough to see it.

Several cards: with ``CUDA_VISIBLE_DEVICES`` naming several cards (and no ``--card``), every visible
card holds the same profile (context, weights, KV pool), as the ranks of a tensor-parallel engine
do; each token's KV is taken on every card, so a request may use what the smallest card's KV cache
holds. A lend or return names one card and changes only that card.

Every generation step goes through the card store: while ``cuda-checkpoint`` (the stand-in) has
the process locked or checkpointed, steps wait, as CUDA calls block in a real one. Requests that
arrive while parked load the engine again (the share becomes "unparked", seed 002).

Slots: with ``--parallel N`` (llama-server's flag) the engine runs at most N requests at once and
queues the rest in arrival order, as llama-server's slots do, and ``GET /props`` says
``{"total_slots": N}`` as llama-server's does; without it every request runs at once and there is
no ``/props``.

Stopping: on SIGTERM or SIGINT the engine gives its memory back to the card store at once, then
closes its connections, as an engine whose CUDA context is torn down before it exits. With
``--crash-on-term`` it instead dies by the signal without freeing anything, as an engine that
crashes or has no handler: its memory stays counted until the driver frees it, ``free_delay_s``
after a reader first sees the process gone (:mod:`berth.sim.cards`, reference/park-mechanisms.md
"After exit"), so tests of late frees see the late free. SIGKILL does the same in either mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid as uuidlib
from typing import AsyncIterator

from aiohttp import web
from berth import startup
from berth.decide.pci import normalize_pci
from berth.decide.units import format_size, parse_duration, parse_size
from berth.sim.cards import RUNNING, SimBusy, SimCards, SimError, SimOOM

__all__ = ["run", "StubEngine", "make_app"]

_KV_BLOCK_TOKENS = 16
_VOCAB = ("berth", "lease", "share", "card", "reserve", "park", "lend", "drain", "wake", "front")
_MAX_TOKENS_LIMIT = 1_000_000
#: How often a load or request held by ``--load-hold`` or ``--token-hold`` looks for its file
#: (test knobs: short is fine).
_HOLD_POLL_S = 0.05


async def _while_exists(path: str) -> None:
    """Return once the file ``path`` does not exist (the ``--*-hold`` test knobs)."""
    while os.path.exists(path):
        await asyncio.sleep(_HOLD_POLL_S)


class _Reject(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.type = status, type_


def _shutting_down() -> _Reject:
    """What a request still in the engine gets once SIGTERM has come: a 503."""
    return _Reject(503, "the engine is shutting down", "unavailable_error")


def _error_body(status: int, message: str, type_: str) -> dict:
    return {"error": {"message": message, "type": type_, "code": status}}


class StubEngine:
    """The engine's memory and state. Sizes in bytes, rates per second."""

    def __init__(self, store: SimCards, pci: str, *, weights_bytes: int, load_s: float,
                 kv_per_token_bytes: int, tokens_per_s: float, residual_bytes: int,
                 kv_pool_bytes: int | None, lend: bool, park_noop: bool, wake_hang: bool,
                 model: str, more_pcis: tuple[str, ...] = (), lend_noop: bool = False,
                 slots: int | None = None, load_hold: str | None = None,
                 token_hold: str | None = None):
        self.store, self.pci, self.pid = store, pci, os.getpid()
        self.pcis = [pci, *(p for p in dict.fromkeys(more_pcis) if p != pci)]
        self.weights_bytes, self.load_s = weights_bytes, load_s
        self.kv_per_token_bytes, self.tokens_per_s = kv_per_token_bytes, tokens_per_s
        self.residual_bytes, self.kv_pool_bytes = residual_bytes, kv_pool_bytes
        self.lend_enabled, self.park_noop, self.wake_hang = lend, park_noop, wake_hang
        self.lend_noop = lend_noop
        self.load_hold, self.token_hold = load_hold, token_hold
        self.model = model
        self.slots = slots
        # Requests past the slots queue here in arrival order (asyncio.Semaphore is FIFO).
        self._slots = asyncio.Semaphore(slots) if slots else None
        self.loaded = False
        self.parked = False
        self.closing = False
        self.held = {p: 0 for p in self.pcis}       # on each card, as the store counts it
        self.kv_alloc = {p: 0 for p in self.pcis}   # KV cache on each card
        self.lent = {p: 0 for p in self.pcis}
        self.kv_used_bytes = 0   # KV in use by requests in flight (on every card)
        self.in_flight = 0
        self._mem = asyncio.Lock()

    @property
    def held_bytes(self) -> int:
        return sum(self.held.values())

    @property
    def kv_alloc_bytes(self) -> int:
        """The KV cache a request may use: what the smallest card holds."""
        return min(self.kv_alloc.values())

    @property
    def lent_bytes(self) -> int:
        return sum(self.lent.values())

    # ---- the card --------------------------------------------------------------------------------

    async def gpu_step(self) -> None:
        """Wait while the process is locked or checkpointed (a CUDA call would block)."""
        while self.store.state_of(self.pid) not in (RUNNING, None):
            await asyncio.sleep(0.01)
        if self.closing:
            raise _shutting_down()

    async def _card(self, nbytes: int, sign: int, pci: str | None = None) -> None:
        """Allocate (``sign`` +1) or free ``nbytes`` on ``pci``, or on every card when None."""
        for p in self.pcis if pci is None else [pci]:
            await self._card_one(p, nbytes, sign)

    async def _card_one(self, pci: str, nbytes: int, sign: int) -> None:
        if nbytes <= 0:
            return
        if self.closing:
            # A request that waited for the memory lock while the engine stopped: the same 503
            # as one that waited for the card (a SimError here reached aiohttp as a 500).
            raise _shutting_down()
        op = self.store.alloc if sign > 0 else self.store.free
        while True:
            await self.gpu_step()
            try:
                op(pci, nbytes, self.pid, block=False)
            except SimBusy:
                continue
            self.held[pci] += sign * nbytes
            return

    async def load(self) -> None:
        """Context, then weights in eight steps over ``load_s``, then the KV pool, then (with
        ``--load-hold``) a wait while the hold file exists. Raises SimOOM."""
        await self._card(self.residual_bytes, +1)
        step, left = self.weights_bytes // 8, self.weights_bytes
        for i in range(8):
            n = left if i == 7 else step
            await self._card(n, +1)
            left -= n
            await asyncio.sleep(self.load_s / 8)
        if self.kv_pool_bytes:
            await self._card(self.kv_pool_bytes, +1)
            self.kv_alloc = {p: self.kv_pool_bytes for p in self.pcis}
        if self.load_hold and os.path.exists(self.load_hold):
            print(f"berth sim engine: pid {self.pid} loaded, held while {self.load_hold} exists "
                  "(--load-hold)", file=sys.stderr, flush=True)
            await _while_exists(self.load_hold)
        self.loaded = True

    def state(self) -> dict:
        """``GET /berth/v1/state``: ``state`` (active / parked / lent), ``lent`` {pci: bytes}."""
        name = "parked" if self.parked else ("lent" if self.lent_bytes else "active")
        return {"state": name, "lent": {p: n for p, n in self.lent.items() if n},
                "held_bytes": self.held_bytes, "weights_bytes": self.weights_bytes,
                "kv_bytes": self.kv_alloc_bytes, "in_flight": self.in_flight}

    async def park(self) -> dict:
        """Free everything but the residual (``--park-noop``: nothing). 409 while lent or busy."""
        async with self._mem:
            if self.parked:
                return self.state()
            if self.lent_bytes:
                raise _Reject(409, f"cannot park while {format_size(self.lent_bytes)} are lent on "
                                   f"{', '.join(p for p, n in self.lent.items() if n)}; return "
                                   "them first", "conflict_error")
            if self.in_flight:
                raise _Reject(409, f"cannot park with {self.in_flight} requests in flight; "
                                   "quiesce first", "conflict_error")
            if not self.park_noop:
                for p in self.pcis:
                    await self._card(self.held[p] - self.residual_bytes, -1, p)
                self.kv_alloc = {p: 0 for p in self.pcis}
            self.parked = True
            return self.state()

    async def wake(self) -> dict:
        """Allocate the weights (and the KV pool) again; an OOM is a 500 and stays parked."""
        if self.wake_hang:
            await asyncio.Event().wait()   # --wake-hang: never answers
        async with self._mem:
            if not self.parked:
                return self.state()
            if not self.park_noop:
                need = self.weights_bytes + (self.kv_pool_bytes or 0)
                try:
                    await self._card(need, +1)
                except SimOOM as e:
                    raise _Reject(500, f"wake failed: {e}", "server_error") from None
                self.kv_alloc = {p: self.kv_pool_bytes or 0 for p in self.pcis}
            self.parked = False
            return self.state()

    async def lend(self, pci: str, nbytes: int) -> dict:
        """Give ``nbytes`` of the unused KV cache back to the card and keep serving (409 if
        there is not that much unused, or while parked; ``--lend-noop``: 200, nothing freed)."""
        async with self._mem:
            self._check_card(pci)
            if self.parked:
                raise _Reject(409, "cannot lend while parked", "conflict_error")
            spare = self.kv_alloc[pci] - self.kv_used_bytes
            if nbytes > spare:
                raise _Reject(409, f"cannot lend {format_size(nbytes)} on {pci}: only "
                                   f"{format_size(spare)} of the KV cache are unused",
                              "conflict_error")
            if self.lend_noop:
                return self.state()
            await self._card(nbytes, -1, pci)
            self.kv_alloc[pci] -= nbytes
            self.lent[pci] += nbytes
            return self.state()

    async def return_(self, pci: str, nbytes: int) -> dict:
        """Grow the KV cache back by ``nbytes`` of what was lent (an OOM is a 500)."""
        async with self._mem:
            self._check_card(pci)
            if nbytes > self.lent[pci]:
                raise _Reject(400, f"bytes: {format_size(nbytes)} is more than the "
                                   f"{format_size(self.lent[pci])} lent on {pci}")
            try:
                await self._card(nbytes, +1, pci)
            except SimOOM as e:
                raise _Reject(500, f"return failed: {e}", "server_error") from None
            self.kv_alloc[pci] += nbytes
            self.lent[pci] -= nbytes
            return self.state()

    def _check_card(self, pci: str) -> None:
        if pci not in self.pcis:
            raise _Reject(400, f"card: this engine runs on {', '.join(self.pcis)}, not {pci}")

    async def _kv(self, tokens: int) -> bool:
        """Take KV for ``tokens`` more tokens, growing the cache if it may. False when full."""
        need = tokens * self.kv_per_token_bytes
        async with self._mem:
            short = self.kv_used_bytes + need - self.kv_alloc_bytes
            if short > 0:
                if self.kv_pool_bytes or self.lent_bytes:
                    return False
                block = _KV_BLOCK_TOKENS * self.kv_per_token_bytes
                for p in self.pcis:
                    short = self.kv_used_bytes + need - self.kv_alloc[p]
                    if short > 0:
                        grow = -(-short // block) * block
                        await self._card(grow, +1, p)
                        self.kv_alloc[p] += grow
            self.kv_used_bytes += need
            return True

    async def generate(self, prompt_tokens: int, max_tokens: int, taken: list[int]
                       ) -> AsyncIterator[str]:
        """Yield up to ``max_tokens`` words; ``taken[0]`` counts the KV bytes this request holds
        (the caller gives them back). Raises SimOOM when the KV cache cannot grow."""
        if not await self._kv(prompt_tokens):
            return
        taken[0] += prompt_tokens * self.kv_per_token_bytes
        for i in range(max_tokens):
            if i and self.token_hold:
                await _while_exists(self.token_hold)
            await self.gpu_step()
            if not await self._kv(1):
                return
            taken[0] += self.kv_per_token_bytes
            await asyncio.sleep(1.0 / self.tokens_per_s)
            yield _VOCAB[i % len(_VOCAB)]

    def slot(self) -> contextlib.AbstractAsyncContextManager:
        """One of the engine's slots, waited for in arrival order (every request at once
        without ``--parallel``)."""
        return self._slots if self._slots is not None else contextlib.nullcontext()

    def give_back_kv(self, nbytes: int) -> None:
        """A request ended: its KV bytes go back to the engine's cache, not to the card."""
        self.kv_used_bytes -= nbytes


# ---- HTTP ----------------------------------------------------------------------------------------

ENGINE = web.AppKey("engine", StubEngine)
PROTOCOL = web.AppKey("protocol", bool)


async def _body(request: web.Request, required: bool) -> dict:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise _Reject(400, "body: expected a JSON object")
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise _Reject(400, f"body: not valid JSON ({e})") from None
    except RecursionError:
        # json.loads gives up on deep nesting with RecursionError, not ValueError.
        raise _Reject(400, "body: JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise _Reject(400, f"body: expected a JSON object, got {type(body).__name__}")
    return body


def _card_bytes(body: dict) -> tuple[str, int]:
    card, nbytes = body.get("card"), body.get("bytes")
    try:
        pci = normalize_pci(card) if isinstance(card, str) else None
    except ValueError:
        pci = None
    if pci is None:
        raise _Reject(400, f"card: expected a PCI address like '0000:05:00.0', got {card!r}")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise _Reject(400, f"bytes: expected a positive integer, got {nbytes!r}")
    return pci, nbytes


def _prompt_tokens(body: dict) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Reject(400, f"messages: expected a non-empty list, got {messages!r}")
    words = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _Reject(400, f"messages[{i}]: expected an object with a role, got {m!r}")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        words += len(str(content or "").split())
    return max(words, 1)


def _max_tokens(body: dict) -> int:
    n = body.get("max_tokens", body.get("max_completion_tokens"))
    if n is None:
        return 16
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= _MAX_TOKENS_LIMIT:
        raise _Reject(400, f"max_tokens: expected an integer from 1 to {_MAX_TOKENS_LIMIT}, got {n!r}")
    return n


def _chunk(cid: str, created: int, model: str, delta: dict, finish: str | None) -> bytes:
    obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    eng = request.app[ENGINE]
    body = await _body(request, required=True)
    prompt, max_tokens = _prompt_tokens(body), _max_tokens(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _Reject(400, f"stream: expected true or false, got {stream!r}")
    if not eng.loaded:
        raise _Reject(503, "Loading model", "unavailable_error")
    if eng.parked:
        await eng.wake()   # a request reached a parked engine around Berth: load again
    taken = [0]
    eng.in_flight += 1
    try:
        async with eng.slot():
            return await _answer(request, eng, body, prompt, max_tokens, taken)
    finally:   # also on a client disconnect, which cancels this handler
        eng.in_flight -= 1
        eng.give_back_kv(taken[0])


async def _answer(request: web.Request, eng: StubEngine, body: dict, prompt: int,
                  max_tokens: int, taken: list[int]) -> web.StreamResponse:
    """A chat completion generated in one of the engine's slots."""
    stream = body.get("stream", False)
    cid, created = f"chatcmpl-{uuidlib.uuid4().hex[:24]}", int(time.time())
    words: list[str] = []
    if not stream:
        try:
            async for w in eng.generate(prompt, max_tokens, taken):
                words.append(w)
        except SimOOM as e:
            raise _Reject(500, str(e), "server_error") from None
        return web.json_response({
            "id": cid, "object": "chat.completion", "created": created, "model": eng.model,
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": " ".join(words)}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": len(words),
                      "total_tokens": prompt + len(words)}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(_chunk(cid, created, eng.model, {"role": "assistant", "content": ""}, None))
    try:
        async for w in eng.generate(prompt, max_tokens, taken):
            words.append(w)
            await resp.write(_chunk(cid, created, eng.model,
                                    {"content": w if len(words) == 1 else " " + w}, None))
    except (SimOOM, _Reject) as e:
        err = _error_body(getattr(e, "status", 500), str(e), getattr(e, "type", "server_error"))
        await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
    else:
        await resp.write(_chunk(cid, created, eng.model, {}, "length"))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    return web.json_response({"object": "list", "data": [
        {"id": eng.model, "object": "model", "created": 0, "owned_by": "berth-sim"}]})


async def _props(request: web.Request) -> web.Response:
    """llama-server's ``GET /props`` as far as Berth reads it: ``total_slots``."""
    eng = request.app[ENGINE]
    if eng.slots is None:
        raise _Reject(404, "no /props: start the engine with --parallel N", "not_found_error")
    return web.json_response({"total_slots": eng.slots, "model_alias": eng.model})


async def _health(request: web.Request) -> web.Response:
    if not request.app[ENGINE].loaded:
        return web.json_response(_error_body(503, "Loading model", "unavailable_error"), status=503)
    return web.json_response({"status": "ok"})


async def _berth_route(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    if not request.app[PROTOCOL]:
        raise _Reject(404, "this engine does not speak the Berth protocol (start it with --protocol)",
                      "not_found_error")
    if not eng.loaded:
        raise _Reject(503, "Loading model", "unavailable_error")
    op = request.match_info["op"]
    if op == "state" and request.method == "GET":
        return web.json_response(eng.state())
    if op in ("park", "wake") and request.method == "POST":
        await _body(request, required=False)
        return web.json_response(await (eng.park() if op == "park" else eng.wake()))
    if op in ("lend", "return") and request.method == "POST":
        if not eng.lend_enabled:
            raise _Reject(404, "this engine does not lend (start it with --lend)", "not_found_error")
        pci, nbytes = _card_bytes(await _body(request, required=True))
        return web.json_response(await (eng.lend(pci, nbytes) if op == "lend"
                                         else eng.return_(pci, nbytes)))
    raise _Reject(404, f"no route {request.method} /berth/v1/{op}", "not_found_error")


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except _Reject as e:
        return web.json_response(_error_body(e.status, str(e), e.type), status=e.status)


def make_app(engine: StubEngine, protocol: bool) -> web.Application:
    """The aiohttp application: OpenAI routes, ``/health`` and ``/berth/v1/{op}``."""
    app = web.Application(middlewares=[_errors])
    app[ENGINE], app[PROTOCOL] = engine, protocol
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/props", _props)
    app.router.add_route("*", "/berth/v1/{op}", _berth_route)
    return app


# ---- the command ---------------------------------------------------------------------------------

def _engine_from_args(args: argparse.Namespace) -> StubEngine:
    store = SimCards(args.dir)
    keys = [args.card]
    if args.card is None:   # every visible device; unset means all, so card 0 (one card)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        keys = ["0"] if visible is None else [k.strip() for k in visible.split(",")]
        if not keys[0]:
            raise ValueError("card: CUDA_VISIBLE_DEVICES is empty, so no card is visible; "
                             "give --card")
    spec, *more = [store.resolve(k) for k in keys if k]
    if not 0 < args.port < 65536:
        raise ValueError(f"port: expected 1-65535, got {args.port}")
    if args.parallel is not None and args.parallel < 1:
        raise ValueError(f"parallel: expected at least 1 slot, got {args.parallel}")
    if not args.tokens_per_s > 0:
        raise ValueError(f"tokens-per-s: must be > 0, got {args.tokens_per_s}")
    pool = parse_size(args.kv_pool, field="kv-pool") if args.kv_pool else None
    return StubEngine(
        store, spec.pci, weights_bytes=parse_size(args.weights, field="weights"),
        load_s=parse_duration(args.load_s, field="load-s"),
        kv_per_token_bytes=parse_size(args.kv_per_token, field="kv-per-token"),
        tokens_per_s=args.tokens_per_s, residual_bytes=parse_size(args.residual, field="residual"),
        kv_pool_bytes=pool, lend=args.lend, park_noop=args.park_noop, wake_hang=args.wake_hang,
        model=args.model, more_pcis=tuple(m.pci for m in more), lend_noop=args.lend_noop,
        slots=args.parallel, load_hold=args.load_hold, token_hold=args.token_hold)


def _die_by(sig: int) -> None:
    """End this process by ``sig`` with its default action: no handler, no cleanup, nothing
    freed (the exit status a supervisor sees is "killed by ``sig``")."""
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)     # not reached: the default action of SIGTERM/SIGINT ends the process


async def _serve(eng: StubEngine, host: str, port: int, protocol: bool,
                 crash_on_term: bool = False) -> int:
    runner = web.AppRunner(make_app(eng, protocol), handler_cancellation=True,
                           shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        print(f"berth sim engine: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    received: list[int] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: int) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    startup.started()                   # its modules are loaded: collect again
    print(f"berth sim engine: pid {eng.pid} serving {eng.model} on http://{host}:{port} "
          f"(card {', '.join(eng.pcis)})", file=sys.stderr, flush=True)
    rc = 0
    loading = asyncio.create_task(eng.load())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.exception() is not None:
        err = loading.exception()
        print(f"torch.OutOfMemoryError: {err}" if isinstance(err, SimOOM)
              else f"berth sim engine: load failed: {err}", file=sys.stderr, flush=True)
        rc = 1
    else:
        await stopping
    loading.cancel()
    stopping.cancel()
    if crash_on_term and received:
        print(f"berth sim engine: pid {eng.pid} dies by signal {received[0]} without freeing "
              f"(--crash-on-term)", file=sys.stderr, flush=True)
        _die_by(received[0])
    eng.closing = True
    eng.store.release(eng.pid)   # everything, before the slow part of shutting down
    await runner.cleanup()
    return rc


def run(args: argparse.Namespace) -> int:
    """``berth sim engine``: serve until SIGTERM/SIGINT; exit 1 on an OOM at start."""
    try:
        eng = _engine_from_args(args)
    except (ValueError, SimError) as e:
        print(f"berth sim engine: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(eng, args.host, args.port, args.protocol,
                              args.crash_on_term))
