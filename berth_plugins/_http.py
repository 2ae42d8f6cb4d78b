"""HTTP calls from a mechanism plugin to its engine, with failures as :class:`MechanismError`.

One concern: the HTTP-speaking mechanisms (``protocol``, ``vllm``, ``sglang``, ``llamacpp``) call
their engine's own port, read a JSON answer, and turn a refused connection, a timeout or a
non-2xx answer into a :class:`~berth_plugins.hookspecs.MechanismError` whose message names the
call and quotes the engine's own error message.

Error bodies understood (reference/park-mechanisms.md): OpenAI style
``{"error": {"message": …}}`` (vLLM 500s, SGLang 400s, llama.cpp), FastAPI's ``{"detail": …}``,
a bare ``{"message": …}``, or plain text.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp

from .hookspecs import ActionContext, MechanismError

__all__ = ["Answer", "Engine", "engine_url", "error_message", "deadline_of"]

#: How much of an action's bound a plugin keeps back for itself, so its own "gave up waiting for
#: X" error arrives before the caller's generic timeout: 10 % of the bound, at most 1 s.
_MARGIN_FRACTION, _MARGIN_MAX_S = 0.1, 1.0

#: Longest a single message from an engine is quoted in an error (characters).
_QUOTE_CHARS = 300


def deadline_of(ctx: ActionContext, started: float) -> float:
    """The monotonic time (seconds) by which the plugin gives up on its own: ``started`` plus
    ``ctx.timeout_s`` less a small margin (see ``_MARGIN_FRACTION``)."""
    margin = min(_MARGIN_MAX_S, ctx.timeout_s * _MARGIN_FRACTION)
    return started + max(ctx.timeout_s - margin, 0.0)


def engine_url(ctx: ActionContext) -> str:
    """``ctx.engine_url`` without a trailing slash. Raises :class:`MechanismError` if unset."""
    if not ctx.engine_url:
        raise MechanismError(ctx.mechanism, f"engine {ctx.engine!r}: no engine_url given; the "
                             "mechanism talks to the engine's own port (never its front)")
    return ctx.engine_url.rstrip("/")


def error_message(body: Any, text: str) -> str:
    """The engine's own error message from a decoded JSON ``body`` (or the raw ``text``)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:_QUOTE_CHARS]
        if isinstance(err, str) and err:
            return err[:_QUOTE_CHARS]
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])[:_QUOTE_CHARS]
    text = text.strip()
    return text[:_QUOTE_CHARS] if text else "(empty body)"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``status``, the decoded JSON ``body`` (``None`` when not JSON) and the
    raw ``text``."""

    status: int
    body: Any
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def message(self) -> str:
        """The engine's error message (see :func:`error_message`)."""
        return error_message(self.body, self.text)


class Engine:
    """An HTTP client for one action on one engine: ``async with Engine(ctx) as eng``.

    ``headers`` are sent with every call (an admin key). Every call is bounded by the time left
    until :func:`deadline_of` (seconds); the caller's ``asyncio.timeout`` bounds the whole action
    as well.
    """

    def __init__(self, ctx: ActionContext, headers: dict[str, str] | None = None):
        self.ctx = ctx
        self.base = engine_url(ctx)
        self.started = time.monotonic()
        self.deadline = deadline_of(ctx, self.started)
        self._headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Engine":
        self._session = aiohttp.ClientSession(headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def fail(self, message: str) -> MechanismError:
        """A :class:`MechanismError` for this action, prefixed with the engine's name."""
        return MechanismError(self.ctx.mechanism, f"engine {self.ctx.engine!r}: {message}")

    def left_s(self) -> float:
        """Seconds left before this plugin gives up on its own (never below 0)."""
        return max(self.deadline - time.monotonic(), 0.0)

    async def call(self, method: str, path: str, body: Any = None) -> Answer:
        """``method path`` with an optional JSON ``body``; returns the :class:`Answer` whatever
        its status. Raises :class:`MechanismError` when the engine cannot be reached or does not
        answer before the deadline."""
        assert self._session is not None, "use `async with Engine(ctx)`"
        url = self.base + path
        left = self.left_s()
        if left <= 0:
            raise self.fail(f"{method} {path}: no time left within {self.ctx.timeout_s:g} s")
        try:
            async with self._session.request(
                    method, url, json=body,
                    timeout=aiohttp.ClientTimeout(total=left)) as resp:
                text = await resp.text()
        except asyncio.TimeoutError:
            raise self.fail(f"{method} {url} did not answer within {left:.1f} s") from None
        except aiohttp.ClientError as e:
            raise self.fail(f"{method} {url} failed: {e}") from e
        try:
            decoded = json.loads(text) if text.strip() else None
        except ValueError:
            decoded = None
        return Answer(resp.status, decoded, text)

    async def expect_ok(self, method: str, path: str, body: Any = None, what: str = "") -> Answer:
        """Like :meth:`call`, but a non-2xx answer raises :class:`MechanismError` quoting the
        engine's message; ``what`` says what the call was for."""
        ans = await self.call(method, path, body)
        if not ans.ok:
            label = f" ({what})" if what else ""
            raise self.fail(f"{method} {path}{label} answered {ans.status}: {ans.message()}")
        return ans

    async def wait_for(self, check: Callable[[], Awaitable[bool]], stuck: Callable[[], str],
                       every_s: float = 0.05) -> None:
        """Poll ``await check()`` every ``every_s`` seconds until it is true. When the next poll
        would pass the deadline, raise :class:`MechanismError` with ``stuck()`` as the message
        (it may name the last state seen): also when the deadline runs out inside a poll
        after an earlier one answered (a loaded machine), which would otherwise say only that
        the last GET timed out."""
        polled = False
        while True:
            try:
                if await check():
                    return
            except MechanismError:
                if polled and self.left_s() <= every_s:
                    raise self.fail(stuck()) from None
                raise
            polled = True
            if self.left_s() <= every_s:
                raise self.fail(stuck())
            await asyncio.sleep(every_s)
            if self.left_s() <= 0:
                # The sleep ended past the deadline (a loaded machine): the next poll could
                # only fail with "no time left", which says nothing of the engine.
                raise self.fail(stuck())
