"""The engine's slots: how many requests it runs at once, so that its front forwards that many and
holds the rest.

Source: issue 34 ("a front forwards what its engine can run at once ... so a park waits for the
running requests, not for a backlog, and the queue's order stays Berth's to decide"). A backlog
forwarded to the engine waits in the engine's own queue, where a park has to wait for all of it
and Berth cannot order it; held in the front, it stays held across a park and goes after the wake.

Where the number comes from (the first found wins):

1. declared: ``berth run --slots N`` (its older name ``--max-in-flight N``), else the engine's
   entry in berth.toml, ``[engines.NAME] slots = N``;
2. measured, once the engine answers its health and before its front opens: llama.cpp's server
   says ``total_slots`` in ``GET /props`` (whatever set them: ``-np``, ``LLAMA_ARG_N_PARALLEL``,
   or its automatic choice);
3. read from the command line (:func:`from_command`): llama-server's ``-np/--parallel N``
   or ``LLAMA_ARG_N_PARALLEL`` (default: automatic, which the server makes 4), vLLM's
   ``--max-num-seqs N``, ComfyUI 1 (its prompt worker runs one prompt at a time).

Otherwise the front forwards every request, as before issue 34, and the run's log says so once,
with how to declare the slots.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import aiohttp
    from berth.front import Front
    from berth.run.cli import RunOptions

__all__ = ["Slots", "from_command", "from_props", "LLAMA_AUTO_SLOTS"]

log = logging.getLogger("berth.run")

#: llama-server's slots when ``-np`` is left automatic (-1): llama.cpp sets 4 and a unified KV
#: cache (seen on ``../shared/tools/llama-server``: ``/props`` says ``total_slots`` 4).
LLAMA_AUTO_SLOTS = 4
#: How long the run waits for ``GET /props`` before it opens the front without it (seconds).
PROPS_TIMEOUT_S = 1.0


def _value(cmd: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` in ``cmd`` (``--flag V`` or ``--flag=V``), as a
    command-line parser takes it."""
    found = None
    for i, arg in enumerate(cmd):
        if arg in names and i + 1 < len(cmd):
            found = cmd[i + 1]
        elif arg.startswith(tuple(n + "=" for n in names)):
            found = arg.partition("=")[2]
    return found


def _count(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None          # the engine refuses its own bad flag; not ours to judge


def _kind(cmd: list[str]) -> str | None:
    """Which engine the command starts: ``llama-server``, ``vllm``, ``comfyui`` or None."""
    for i, arg in enumerate(cmd):
        base = os.path.basename(arg)
        if base.startswith("llama-server"):
            return "llama-server"
        if (base == "vllm" and cmd[i + 1:i + 2] == ["serve"]) \
                or arg.startswith("vllm.entrypoints"):
            return "vllm"
        if base in ("comfy", "comfyui") or (
                base == "main.py" and "comfyui" in os.path.abspath(arg).lower()):
            return "comfyui"
    return None


def from_command(cmd: list[str], env: Mapping[str, str] | None = None
                 ) -> tuple[int | None, str]:
    """The engine's slots as its command line ``cmd`` sets them, and where that was read
    (words for the log); ``(None, "")`` for an engine this does not know, or a llama-server
    in router mode (``--models-dir``/``--models-preset``: several models, slots each).
    ``env``: the environment the engine starts with (default this process's)."""
    env = os.environ if env is None else env
    kind = _kind(cmd)
    if kind == "llama-server":
        if _value(cmd, ("--models-dir", "--models-preset")) is not None:
            return None, ""
        n = _count(_value(cmd, ("-np", "--parallel")))
        if n is None:
            n = _count(env.get("LLAMA_ARG_N_PARALLEL"))
        if n is not None and n >= 1:
            return n, f"llama-server's --parallel {n}"
        return LLAMA_AUTO_SLOTS, f"llama-server's automatic --parallel ({LLAMA_AUTO_SLOTS})"
    if kind == "vllm":
        n = _count(_value(cmd, ("--max-num-seqs", "--max_num_seqs")))
        return (n, f"vLLM's --max-num-seqs {n}") if n is not None and n >= 1 else (None, "")
    if kind == "comfyui":
        return 1, "ComfyUI runs one prompt at a time"
    return None, ""


async def from_props(http: "aiohttp.ClientSession", url: str,
                     timeout_s: float = PROPS_TIMEOUT_S) -> int | None:
    """llama.cpp's server's slots: ``total_slots`` (a whole number >= 1) in ``GET url/props``;
    ``None`` when the engine answers no such thing within ``timeout_s`` seconds (another
    engine's 404, a router's ``/props``, no answer). Raises nothing."""
    import aiohttp
    try:
        async with http.get(url.rstrip("/") + "/props",
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            doc = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    n = doc.get("total_slots") if isinstance(doc, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


class Slots:
    """One run's count of its engine's slots: :attr:`n` (``None``: unknown, forward all) and
    :attr:`source` (where it came from, words). Made from the run's options (the flag, else the
    command line), then :meth:`declare` (berth.toml's entry), :meth:`measure` (``/props``) and
    :meth:`apply` (the front forwards that many; the log says it once)."""

    def __init__(self, o: "RunOptions"):
        self.engine = o.engine
        self.declared = o.max_in_flight is not None
        if self.declared:
            self.n, self.source = o.max_in_flight, "declared with --slots"
        else:
            self.n, self.source = from_command(o.cmd)
        self._said: tuple[int | None, str] | None = None

    def declare(self, entry_slots: int | None) -> None:
        """The engine's entry says ``slots = entry_slots`` (``None``: it does not); the flag
        wins."""
        if not self.declared and entry_slots is not None:
            self.declared = True
            self.n, self.source = entry_slots, f"declared in [engines.{self.engine}] slots"

    async def measure(self, http: "aiohttp.ClientSession", url: str | None) -> None:
        """Ask the started engine at ``url`` (``GET /props``) unless the slots were declared."""
        if self.declared or not url:
            return
        n = await from_props(http, url)
        if n is not None:
            self.n, self.source = n, "measured: its /props says total_slots"

    def apply(self, front: "Front") -> None:
        """The front forwards at most :attr:`n` writes at once; the log says how many and why,
        once for each change."""
        front.set_max_in_flight(self.n)
        if self._said == (self.n, self.source):
            return
        self._said = (self.n, self.source)
        if self.n is not None:
            log.info("the front forwards at most %d request%s at once to %s (%s); the rest "
                     "wait in the front", self.n, "" if self.n == 1 else "s", self.engine,
                     self.source)
        else:
            log.info("the front forwards every request to %s: its slots are unknown, so a "
                     "backlog waits in the engine's own queue and a park waits for all of it; "
                     "declare them with `berth run --slots N` or `[engines.%s] slots = N`",
                     self.engine, self.engine)
