"""Errors in OpenAI's shape, plus llama-swap's ``src`` (reference "llama-swap"; STYLE.md).

``src`` names who failed: ``"berth"`` (this gateway or berthd), ``"peer"`` (another machine's
gateway could not be reached or refused), ``"engine"`` (the engine or its front answered with an
error the gateway passes on unchanged; the gateway itself never writes ``"engine"``)::

    {"error": {"message": "...", "type": "unavailable_error", "code": 503},
     "src": "peer", "reason": "peer_down"}
"""

from __future__ import annotations

import json

from aiohttp import web

__all__ = ["error", "TYPES"]

#: The OpenAI ``type`` for each status the gateway answers itself.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 502: "upstream_error",
         503: "unavailable_error", 504: "timeout_error"}

_RETRY_AFTER_S = 1


def error(status: int, reason: str, message: str, src: str = "berth") -> web.Response:
    """An error answer: ``status`` (HTTP), ``reason`` (a short machine word such as
    ``model_not_found``), ``message`` (for people), ``src`` (``berth`` or ``peer``). A 503 carries
    ``Retry-After``."""
    body = {"error": {"message": message, "type": TYPES.get(status, "api_error"), "code": status,
                      "param": None},
            "src": src, "reason": reason}
    headers = {"Retry-After": str(_RETRY_AFTER_S)} if status == 503 else None
    return web.Response(status=status, body=json.dumps(body).encode(),
                        content_type="application/json", headers=headers)
