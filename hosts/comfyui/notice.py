"""What a held prompt tells ComfyUI's UI: progress text over ComfyUI's own websocket.

Source: issue 28 ("a held prompt says why in ComfyUI"); ComfyUI ``server.py`` (read at 0.3.64):
``PromptServer.send_progress_text(text, node_id, sid)`` packs binary event 3
(``protocol.BinaryEventTypes.TEXT``) as a 4-byte big-endian length of the node id, the node id
and the UTF-8 text, and ``send_sync(event, data, sid)`` queues it, from any thread, for the
server's ``publish_loop``, which sends it to the websocket of client ``sid`` (every open page
when ``sid`` is None). ComfyUI's frontend shows it on that node, as it shows the wait of
ComfyUI's own API nodes. The client is the one that posted the prompt (``client_id`` in the
body of ``POST /prompt``, which is the page's ``clientId``).

A held prompt is not queued yet, so it has no prompt id; the text goes to the first node that
loads a model (the one that needs the card), else the prompt's first node.
"""

from __future__ import annotations

import collections
import logging
import struct
import time
from typing import Any, Callable

from .estimate import LOADERS

__all__ = ["TEXT_EVENT", "target", "send_text", "held_text", "Teller", "WaitMeter"]

log = logging.getLogger("berth.comfyui")

#: ``protocol.BinaryEventTypes.TEXT``: progress text on a node.
TEXT_EVENT = 3


def target(body: Any) -> tuple[str | None, str | None]:
    """``(sid, node_id)`` for a ``POST /prompt`` body: the client that posted it (``None``:
    every page) and the node the text is shown on (``None``: a body with no prompt)."""
    if not isinstance(body, dict):
        return None, None
    sid = body.get("client_id")
    sid = str(sid) if sid else None
    prompt = body.get("prompt")
    if not isinstance(prompt, dict) or not prompt:
        return sid, None
    ids = sorted(prompt, key=lambda k: (len(str(k)), str(k)))
    for nid in ids:
        node = prompt[nid]
        if isinstance(node, dict) and node.get("class_type") in LOADERS:
            return sid, str(nid)
    return sid, str(ids[0])


def send_text(server: Any, body: Any, text: str) -> bool:
    """Send ``text`` as ComfyUI's progress text for the prompt in ``body`` (any thread).
    True when it was queued; False without a node to show it on or a server that sends."""
    sid, node = target(body)
    if node is None or server is None:
        return False
    try:
        if hasattr(server, "send_progress_text"):
            server.send_progress_text(text, node, sid)
        else:                   # releases before send_progress_text: the same bytes by hand
            nid = node.encode()
            server.send_sync(TEXT_EVENT, struct.pack(">I", len(nid)) + nid + text.encode(), sid)
        return True
    except Exception as e:      # the UI's text must never break a prompt
        log.warning("Berth: could not tell ComfyUI's UI why the prompt waits: %s", e)
        return False


def held_text(why: str, waited_s: float, expected_s: float | None) -> str:
    """The words a held prompt shows: ``"Berth: waiting for the card: WHY (waited 3 s; about
    4 s more)"``; the expected wait is left out while none is known."""
    more = f"; about {expected_s:.0f} s more" if expected_s is not None else ""
    return f"Berth: waiting for the card: {why} (waited {waited_s:.0f} s{more})"


class WaitMeter:
    """The last ``keep`` waits of one kind (seconds), for an expected wait: their mean less
    what a waiter already waited (``None`` before the first, or once past the mean: the mean
    says nothing about it then), as the board's expected wait is."""

    def __init__(self, keep: int = 20):
        self._waits: collections.deque[float] = collections.deque(maxlen=keep)

    def record(self, waited_s: float) -> None:
        self._waits.append(max(0.0, float(waited_s)))

    def expected(self, waited_s: float) -> float | None:
        if not self._waits:
            return None
        left = sum(self._waits) / len(self._waits) - waited_s
        return left if left > 0 else None


class Teller:
    """Tells one held prompt's page why it waits (``send(text)``): when the reason changes,
    else every ``every_s`` seconds; :meth:`ready` says the wait is over, if anything was said."""

    def __init__(self, send: Callable[[str], None], every_s: float = 2.0):
        self.send, self.every_s = send, every_s
        self.why: str | None = None
        self.at: float | None = None

    def tell(self, why: str, waited_s: float, expected_s: float | None) -> None:
        now = time.monotonic()
        if why == self.why and self.at is not None and now - self.at < self.every_s:
            return
        self.why, self.at = why, now
        self.send(held_text(why, waited_s, expected_s))

    def ready(self, waited_s: float) -> None:
        if self.at is not None:
            self.send(f"Berth: the card is ready (waited {waited_s:.0f} s)")
