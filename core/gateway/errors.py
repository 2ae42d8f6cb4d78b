"""The answers the gateway writes itself, as whole HTTP/1.1 messages: errors in OpenAI's shape plus
llama-swap's ``src`` (reference "llama-swap"; STYLE.md), JSON documents, and redirects.

``src`` names who failed: ``"berth"`` (this gateway or berthd), ``"peer"`` (another machine's
gateway could not be reached, or refused), ``"engine"`` (the engine or its front answered with
an error: passed on as it came, with ``"src": "engine"`` added to a JSON object that names no
``src``, :class:`berth.gateway.relay.RelayConnection`)::

    {"error": {"message": "...", "type": "unavailable_error", "code": 503},
     "src": "peer", "reason": "peer_down"}

A 503 carries ``Retry-After``.
"""

from __future__ import annotations

import json

from berth.front.rules import error_answer, phrase

__all__ = ["error", "document", "answer", "redirect", "TYPES", "event"]

#: The OpenAI ``type`` for each status the gateway answers itself.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 408: "invalid_request_error",
         413: "invalid_request_error", 500: "api_error", 502: "upstream_error",
         503: "unavailable_error", 504: "timeout_error"}


def error(status: int, reason: str, message: str, src: str = "berth", *, head: bool = False,
          retry_after_s: int = 1, headers: dict[str, str] | None = None,
          close: bool = False) -> bytes:
    """An error answer: ``status`` (HTTP), ``reason`` (a short machine word such as
    ``model_not_found``), ``message`` (for people), ``src`` (``berth`` or ``peer``)."""
    return error_answer(status, reason, message, TYPES.get(status, "api_error"), close=close,
                        head=head, src=src, retry_after_s=retry_after_s, headers=headers)


def answer(status: int, body: bytes, content_type: str, *, head: bool = False,
           headers: dict[str, str] | None = None) -> bytes:
    """A whole answer with ``body`` (left out for a HEAD, its length kept)."""
    lines = [f"HTTP/1.1 {status} {phrase(status)}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}"]
    if headers:
        lines.extend(f"{k}: {v}" for k, v in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


def document(doc: object, status: int = 200, *, head: bool = False) -> bytes:
    """A JSON answer."""
    return answer(status, json.dumps(doc).encode(), "application/json; charset=utf-8", head=head)


def redirect(location: str) -> bytes:
    """A 302 to ``location``."""
    return answer(302, b"", "text/plain; charset=utf-8", headers={"Location": location})


def event(status: int, reason: str, message: str, src: str) -> bytes:
    """The server-sent event that ends a stream cut after its headers: OpenAI's in-stream error
    (``data: {"error": …}``), then ``data: [DONE]`` as vLLM ends a stream after an error. It
    begins with a blank line, which closes an event the upstream left half-written (a blank
    line after a complete event dispatches nothing)."""
    doc = {"error": {"message": message, "type": TYPES.get(status, "api_error"), "code": status},
           "src": src, "reason": reason}
    return b"\n\ndata: " + json.dumps(doc).encode() + b"\n\ndata: [DONE]\n\n"
