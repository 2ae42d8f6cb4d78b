"""Errors in OpenAI's shape, plus llama-swap's ``src`` (reference "llama-swap"; STYLE.md).

``src`` names who failed: ``"berth"`` (this gateway or berthd), ``"peer"`` (another machine's
gateway could not be reached or refused), ``"engine"`` (the engine or its front answered with an
error: passed on as it came, with ``"src": "engine"`` added to a JSON object that names no
``src``, :func:`berth.gateway.relay.relay`)::

    {"error": {"message": "...", "type": "unavailable_error", "code": 503},
     "src": "peer", "reason": "peer_down"}
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

__all__ = ["error", "TYPES", "openai_errors"]

log = logging.getLogger("berth.gateway")

#: The OpenAI ``type`` for each status the gateway answers itself.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error",
         500: "api_error", 502: "upstream_error",
         503: "unavailable_error", 504: "timeout_error"}

_RETRY_AFTER_S = 1


def error(status: int, reason: str, message: str, src: str = "berth",
          headers: dict[str, str] | None = None) -> web.Response:
    """An error answer: ``status`` (HTTP), ``reason`` (a short machine word such as
    ``model_not_found``), ``message`` (for people), ``src`` (``berth`` or ``peer``). A 503 carries
    ``Retry-After``; ``headers`` are added (a 405's ``Allow``)."""
    body = {"error": {"message": message, "type": TYPES.get(status, "api_error"), "code": status,
                      "param": None},
            "src": src, "reason": reason}
    headers = dict(headers or {})
    if status == 503:
        headers["Retry-After"] = str(_RETRY_AFTER_S)
    return web.Response(status=status, body=json.dumps(body).encode(),
                        content_type="application/json", headers=headers)


#: aiohttp's own refusals (raised before a handler could answer) -> this gateway's reason word.
_REASONS = {400: "bad_request", 404: "no_route", 405: "method_not_allowed",
            413: "body_too_large", 414: "uri_too_long"}


@web.middleware
async def openai_errors(request: web.Request, handler):
    """Every answer the gateway writes itself keeps OpenAI's shape: aiohttp's own refusals (a
    body over ``client_max_size`` is a 413, raised inside ``request.read()``) become :func:`error`
    answers, and a failure of the gateway's own code a logged 500 without a traceback to the
    client. The board's pages (``/board/``) keep their own answers and headers."""
    if request.path.startswith("/board/"):
        return await handler(request)
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if e.status == 413:
            message = (f"the body is over the gateway's limit of {request.client_max_size} bytes "
                       f"({e.text or 'too large'})")
        else:
            message = f"{request.method} {request.path}: {e.reason}"
        return error(e.status, _REASONS.get(e.status, "refused"), message)
    except ConnectionResetError:
        raise           # the client went away mid-answer: there is nobody to answer
    except Exception:
        log.exception("gateway: %s %s failed", request.method, request.path)
        return error(500, "gateway_failed", f"{request.method} {request.path}: the gateway failed "
                                            f"on this request (its log has the details)")
