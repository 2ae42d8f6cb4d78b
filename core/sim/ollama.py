"""An Ollama stand-in: ``ollama serve``'s API, minimally, with each loaded model's memory on a
simulated card.

Source: Ollama's API as its documentation gives it (docs/api.md: "Generate a completion",
"Generate a chat completion", "List Local Models", "List Running Models", "Unload a model";
the OpenAI compatibility page for ``/v1/chat/completions``; ``OLLAMA_HOST`` and
``OLLAMA_KEEP_ALIVE`` for ``ollama serve``). Run as ``berth sim ollama --model NAME=SIZE…``;
it listens where ``OLLAMA_HOST`` says (default ``127.0.0.1:11434``), as ``ollama serve`` does, so
``berth run … -- env OLLAMA_HOST=127.0.0.1:{port} berth sim ollama …`` runs it as
``ollama serve`` would be run.

What it answers:

- ``GET /`` ("Ollama is running"), ``GET /api/version``;
- ``GET /api/tags``: the models it has (``--model``); ``GET /api/ps``: the loaded ones, with
  ``size``, ``size_vram`` and ``expires_at``;
- ``POST /api/generate`` and ``POST /api/chat``: a request naming a model loads it (its size
  allocated on the card, after ``--load-s``), answers a few words (streamed as JSON lines unless
  ``"stream": false``), and keeps it loaded for ``keep_alive`` (a duration like ``"5m"``, a
  number of seconds, negative for ever; default ``$OLLAMA_KEEP_ALIVE`` or 5 minutes). An empty
  prompt (or no messages) only loads; with ``keep_alive`` 0 it unloads: the model leaves
  ``/api/ps`` at once and its memory leaves the card ``--unload-delay`` later, as a runner
  process ends after Ollama has answered. Each answer ends ``done_reason`` ``stop``, ``load`` or
  ``unload``;
- ``POST /v1/chat/completions``: the same through the OpenAI shape (``stream`` as SSE).

An unknown model is a 404 ``{"error": "model 'x' not found"}``; a model that does not fit on
the card a 500 naming the bytes it needed, and the card counts a simulated OOM. On SIGTERM or
SIGINT everything it holds leaves the card and it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from aiohttp import web
from berth.decide.units import format_size, parse_duration, parse_size
from berth.sim.cards import SimBusy, SimCards, SimError, SimOOM

__all__ = ["arguments", "run", "Ollama", "make_app"]

_WORDS = ("berth", "lease", "card", "park", "wake", "front", "share", "reserve")
_DEFAULT_HOST = "127.0.0.1:11434"


class _Refuse(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Loaded:
    """A loaded model: its bytes on the card, and when it unloads (monotonic seconds; ``None``:
    never)."""

    size_bytes: int
    expires_at: float | None


def keep_alive_s(value, default_s: float) -> float | None:
    """Ollama's ``keep_alive``: seconds to stay loaded (0: unload now), ``None`` for ever.
    A number is seconds, a string a duration (``"5m"``, ``"0"``, ``"-1"``). Raises
    ``_Refuse(400)`` naming the value."""
    if value is None:
        return default_s
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, (int, float)):
            secs = float(value)
        else:
            text = str(value).strip()
            secs = -1.0 if text.startswith("-") else (
                float(text) if text.replace(".", "", 1).isdigit()
                else parse_duration(text, field="keep_alive"))
    except ValueError:
        raise _Refuse(400, f"keep_alive: expected a duration like \"5m\" or seconds, "
                           f"got {value!r}") from None
    return None if secs < 0 else secs


class Ollama:
    """The models, the loaded ones and the card. Sizes in bytes, times monotonic seconds."""

    def __init__(self, store: SimCards, pci: str, models: dict[str, int], load_s: float,
                 unload_delay_s: float, keep_alive_default_s: float):
        self.store, self.pci, self.pid = store, pci, os.getpid()
        self.models, self.load_s = models, load_s
        self.unload_delay_s, self.keep_alive_default_s = unload_delay_s, keep_alive_default_s
        self.loaded: dict[str, Loaded] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    def _known(self, name) -> str:
        if not isinstance(name, str) or not name:
            raise _Refuse(400, f"model: expected a model name, got {name!r}")
        for n in (name, f"{name}:latest"):
            if n in self.models:
                return n
        raise _Refuse(404, f"model '{name}' not found")

    async def _card(self, nbytes: int, sign: int) -> None:
        """Allocate or free on the card, waiting while a checkpoint tool holds the process."""
        op = self.store.alloc if sign > 0 else self.store.free
        while True:
            try:
                op(self.pci, nbytes, self.pid, block=False)
                return
            except SimBusy:
                await asyncio.sleep(0.01)

    async def load(self, name: str, keep_s: float | None) -> None:
        """Load ``name`` if it is not (its size on the card after ``load_s``) and set how long
        it stays. Raises ``_Refuse(500)`` when it does not fit."""
        async with self._lock:
            if name not in self.loaded:
                size = self.models[name]
                try:
                    await self._card(size, +1)
                except SimOOM as e:
                    raise _Refuse(500, f"model requires more memory than the card has free: "
                                       f"{format_size(size)} for {name} ({e})") from None
                self.loaded[name] = Loaded(size, None)
                await asyncio.sleep(self.load_s)
            self.loaded[name].expires_at = None if keep_s is None else time.monotonic() + keep_s

    async def unload(self, name: str) -> None:
        """Out of ``/api/ps`` now; its memory off the card ``unload_delay_s`` later."""
        async with self._lock:
            gone = self.loaded.pop(name, None)
        if gone is not None:
            task = asyncio.create_task(self._free_later(gone.size_bytes))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _free_later(self, nbytes: int) -> None:
        await asyncio.sleep(self.unload_delay_s)
        await self._card(nbytes, -1)

    async def expire(self) -> None:
        """Unload each model whose keep_alive ran out, every 0.1 s, until cancelled."""
        while True:
            now = time.monotonic()
            for name, m in list(self.loaded.items()):
                if m.expires_at is not None and m.expires_at <= now:
                    await self.unload(name)
            await asyncio.sleep(0.1)

    def ps(self) -> dict:
        now, wall = time.monotonic(), time.time()
        return {"models": [{
            "name": n, "model": n, "size": m.size_bytes, "size_vram": m.size_bytes,
            "digest": _digest(n), "details": _details(), "context_length": 4096,
            "expires_at": _iso(wall + (m.expires_at - now) if m.expires_at is not None
                               else wall + 10 * 365 * 86400)}
            for n, m in self.loaded.items()]}

    def tags(self) -> dict:
        return {"models": [{"name": n, "model": n, "size": s, "digest": _digest(n),
                            "modified_at": _iso(0), "details": _details()}
                           for n, s in self.models.items()]}


def _digest(name: str) -> str:
    import hashlib
    return hashlib.sha256(name.encode()).hexdigest()


def _details() -> dict:
    return {"parent_model": "", "format": "gguf", "family": "stand-in", "families": ["stand-in"],
            "parameter_size": "", "quantization_level": ""}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---- HTTP ----------------------------------------------------------------------------------------

OLLAMA = web.AppKey("ollama", Ollama)


async def _body(request: web.Request) -> dict:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as e:
        raise _Refuse(400, f"invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise _Refuse(400, "the body must be a JSON object")
    return body


def _words(doc: dict, key: str) -> list[str]:
    """As many words as ``doc[key]`` asks (default 8, at most 10,000)."""
    n = doc.get(key, 8)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= 10_000:
        raise _Refuse(400, f"{key}: expected a number of tokens from 1 to 10000, got {n!r}")
    return [_WORDS[i % len(_WORDS)] for i in range(n)]


async def _native(request: web.Request, chat: bool) -> web.StreamResponse:
    """``/api/generate`` and ``/api/chat``: load, unload, or a few words."""
    ol = request.app[OLLAMA]
    body = await _body(request)
    name = ol._known(body.get("model"))
    keep = keep_alive_s(body.get("keep_alive"), ol.keep_alive_default_s)
    empty = not body.get("messages") if chat else not body.get("prompt")
    base = {"model": name, "created_at": _iso(time.time())}
    shape = (lambda text: {"message": {"role": "assistant", "content": text}}) if chat \
        else (lambda text: {"response": text})
    if empty:
        if keep == 0:
            await ol.unload(name)
            return web.json_response({**base, **shape(""), "done": True, "done_reason": "unload"})
        await ol.load(name, keep)
        return web.json_response({**base, **shape(""), "done": True, "done_reason": "load"})
    await ol.load(name, keep)
    words = _words(body.get("options") if isinstance(body.get("options"), dict) else {},
                   "num_predict")
    if keep == 0:
        await ol.unload(name)
    end = {**base, **shape(""), "done": True, "done_reason": "stop", "eval_count": len(words)}
    if body.get("stream", True) is False:
        return web.json_response({**end, **shape(" ".join(words))})
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    for i, w in enumerate(words):
        await resp.write(json.dumps({**base, **shape(w if i == 0 else " " + w),
                                     "done": False}).encode() + b"\n")
    await resp.write(json.dumps(end).encode() + b"\n")
    await resp.write_eof()
    return resp


async def _generate(request: web.Request) -> web.StreamResponse:
    return await _native(request, chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _native(request, chat=True)


async def _openai_chat(request: web.Request) -> web.StreamResponse:
    ol = request.app[OLLAMA]
    body = await _body(request)
    name = ol._known(body.get("model"))
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise _Refuse(400, "messages: expected a non-empty list")
    await ol.load(name, ol.keep_alive_default_s)
    words = _words(body, "max_tokens")
    cid, created = f"chatcmpl-{os.urandom(6).hex()}", int(time.time())
    if not body.get("stream"):
        return web.json_response({
            "id": cid, "object": "chat.completion", "created": created, "model": name,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": " ".join(words)}}]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, w in enumerate(words):
        chunk = {"id": cid, "object": "chat.completion.chunk", "created": created,
                 "model": name, "choices": [{"index": 0, "finish_reason": None,
                                             "delta": {"content": w if i == 0 else " " + w}}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.0.0-berth-stand-in"})


async def _ps(request: web.Request) -> web.Response:
    return web.json_response(request.app[OLLAMA].ps())


async def _tags(request: web.Request) -> web.Response:
    return web.json_response(request.app[OLLAMA].tags())


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except _Refuse as e:
        return web.json_response({"error": str(e)}, status=e.status)


def make_app(ol: Ollama) -> web.Application:
    """The stand-in's routes (the module docstring lists them)."""
    app = web.Application(middlewares=[_errors])
    app[OLLAMA] = ol
    r = app.router
    r.add_get("/", _root)
    r.add_get("/api/version", _version)
    r.add_get("/api/tags", _tags)
    r.add_get("/api/ps", _ps)
    r.add_post("/api/generate", _generate)
    r.add_post("/api/chat", _chat)
    r.add_post("/v1/chat/completions", _openai_chat)
    return app


# ---- the command ---------------------------------------------------------------------------------

def arguments(p: argparse.ArgumentParser) -> None:
    """``berth sim ollama``'s flags; where it listens is ``$OLLAMA_HOST``, as for Ollama."""
    p.description = ("An Ollama stand-in on a simulated card: it listens on $OLLAMA_HOST "
                     f"(default {_DEFAULT_HOST}) and answers /api/ps, /api/tags, "
                     "/api/generate, /api/chat and /v1/chat/completions.")
    p.add_argument("--model", action="append", required=True, metavar="NAME=SIZE",
                   help="a model it has and its size loaded, e.g. qwen3:8b=6GiB (repeatable)")
    p.add_argument("--card", help="simulated card (default: $CUDA_VISIBLE_DEVICES' first, "
                                  "else the first card)")
    p.add_argument("--load-s", default="0.2", metavar="S", help="seconds a load takes")
    p.add_argument("--unload-delay", default="0.3", metavar="S",
                   help="seconds between an unload's answer and its memory leaving the card")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")


def _models(values: list[str]) -> dict[str, int]:
    out = {}
    for v in values:
        name, eq, size = v.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--model: expected NAME=SIZE like qwen3:8b=6GiB, got {v!r}")
        name = name.strip() if ":" in name else f"{name.strip()}:latest"
        out[name] = parse_size(size, field=f"--model {name}")
    return out


def _listen() -> tuple[str, int]:
    text = os.environ.get("OLLAMA_HOST") or _DEFAULT_HOST
    text = text.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"OLLAMA_HOST: expected HOST:PORT like {_DEFAULT_HOST}, got {text!r}")
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    """``berth sim ollama``: serve until SIGTERM or SIGINT."""
    try:
        models = _models(args.model)
        host, port = _listen()
        store = SimCards(args.dir)
        key = args.card or (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or "0"
        ol = Ollama(store, store.resolve(key).pci, models,
                    parse_duration(args.load_s, field="--load-s"),
                    parse_duration(args.unload_delay, field="--unload-delay"),
                    keep_alive_s(os.environ.get("OLLAMA_KEEP_ALIVE"), 300.0))
    except (ValueError, SimError, _Refuse) as e:
        print(f"berth sim ollama: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(ol, host, port))


async def _serve(ol: Ollama, host: str, port: int) -> int:
    runner = web.AppRunner(make_app(ol), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        print(f"berth sim ollama: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"berth sim ollama: pid {ol.pid} on http://{host}:{port} (card {ol.pci}; models "
          f"{', '.join(f'{n} {format_size(s)}' for n, s in ol.models.items())})",
          file=sys.stderr, flush=True)
    expiry = asyncio.create_task(ol.expire())
    await stop.wait()
    expiry.cancel()
    ol.store.release(ol.pid)            # everything, before the slow part of shutting down
    await runner.cleanup()
    return 0

