"""The web board's HTTP side: the page, its files, the event stream and the operator actions.

Source: issue 15. Routes, relative to where the app is mounted (berthd serves it at ``/`` on its
board listener; the gateway may mount it with ``app.add_subapp("/board/", board_app(hub, key))``,
the page's URLs are relative so either works):

========================  =========================================================================
``GET  /``                the page (``index.html``)
``GET  /static/{name}``   ``page.js``, ``page.css``
``GET  /state``           ``{"operator", "who", "board", "history"}`` once (JSON)
``GET  /metrics``         berthd's figures as Prometheus text (the control API's), read-only:
                          no key, for a scraper (issue 29); the key is for actions only
``GET  /events``          server-sent events: ``hello`` (operator flag and the hour of history),
                          then ``board`` at each change; ``retry: 1000`` so a page reconnects
                          within a second of berthd coming back
``POST /login``           ``{"name", "key"}``: with the right key, starts an operator session and
                          sets its cookie (403 otherwise; every error, a wrong method's too, is
                          JSON ``{"error"}`` naming the field, and never says the key)
``POST /logout``          ends the session and forgets the cookie
``POST /operator/{op}``   ``{"target"}``: park, wake, drain, hold, release-hold. Needs the operator
                          cookie and the ``X-Berth-Board`` header (a cross-site form cannot set
                          it), or ``Authorization: Bearer <key>``; 403 without. Logged with who.
========================  =========================================================================

An operator session (issue 26) is a random token (256 bits) that berthd keeps with the name and
an expiry (``[board] session_limit``, default 8 h); sign-out ends it, and a token not in the table
(expired, signed out, from before a restart) is no session. Its cookie (``berth_board``:
HttpOnly, SameSite=Strict, ``Max-Age`` the limit) is scoped to the board's path (``/`` on
berthd's own listener, ``/board`` under the gateway), and fronts and the gateway strip it from
what they relay (:data:`berth.front.rules.BOARD_COOKIE`).

Every answer carries a strict Content-Security-Policy (no inline script or style, scripts only
from the board itself). Engine names reach the page only as data; the page sets them with
``textContent``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import time
from importlib import resources

from aiohttp import web
from berth.daemon.board_web.hub import Hub

__all__ = ["board_app", "CSP", "OPS"]

log = logging.getLogger("berth.daemon.board_web")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
OPS = ("park", "wake", "drain", "hold", "release-hold")
#: The session cookie; berth.front.rules.BOARD_COOKIE (which fronts strip) names the same.
COOKIE = "berth_board"
#: Sessions kept at most (the oldest goes first): a flood of sign-ins cannot grow berthd.
MAX_SESSIONS = 256
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,40}$")
_FILES = {"page.js": "application/javascript", "page.css": "text/css"}
HUB = web.AppKey("board_hub", Hub)
KEY = web.AppKey("board_key", str)
SESSIONS = web.AppKey("board_sessions", dict)     # token -> (name, expires at, monotonic s)
SESSION_S = web.AppKey("board_session_s", float)


#: The routes a script calls (the page's ``post``), whose errors are JSON ``{"error"}``.
_ACTIONS = re.compile(r"/(login|logout|operator/[^/]*)$")
#: The largest request body the board takes, bytes (a sign-in or an action is a few).
MAX_BODY_BYTES = 64 << 10
#: Seconds a request body may take to arrive (a sign-in's or an action's: a few bytes).
_BODY_WAIT_S = 10.0


@web.middleware
async def _headers(request: web.Request, handler):
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        resp = _json_error(request, e) if e.status >= 400 and _ACTIONS.search(request.path) \
            else e
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers.setdefault("Cache-Control", "no-store")
    if isinstance(resp, web.HTTPException):
        raise resp
    return resp


def _json_error(request: web.Request, e: web.HTTPException) -> web.Response:
    """aiohttp's own 4xx (a wrong method, a body over the limit, a body not read in time) as
    the action routes answer every error: JSON ``{"error"}`` that names what is wrong."""
    if isinstance(e, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(e.allowed_methods)) or "none"
        resp = _err(405, f"method {request.method}: {request.path} takes {allowed}")
        resp.headers["Allow"] = ",".join(sorted(e.allowed_methods))
        return resp
    if isinstance(e, web.HTTPRequestEntityTooLarge):
        return _err(413, f"body: over this board's limit of {MAX_BODY_BYTES} bytes")
    resp = _err(e.status, e.reason or f"HTTP {e.status}")
    if e.status == 408:
        resp.force_close()     # the rest of the body may still come: the connection ends
    return resp


def operator_of(request: web.Request) -> str | None:
    """Who the caller is as an operator (the name they logged in with, or ``"bearer key"``),
    or ``None``: no key configured, no valid cookie or bearer key."""
    key = request.app[KEY]
    if not key:
        return None
    bearer = request.headers.get("Authorization", "")
    if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:], key):
        return "bearer key"
    token = request.cookies.get(COOKIE)
    found = request.app[SESSIONS].get(token) if token else None
    if found is None:
        return None
    name, until = found
    if time.monotonic() >= until:
        del request.app[SESSIONS][token]
        return None
    return name


def _cookie_path(request: web.Request) -> str:
    """The board's own path: where it is mounted (``/`` on berthd's listener, ``/board`` when
    the gateway mounts it at ``/board/``), so the cookie goes to no other page of the host."""
    canonical = request.match_info.route.resource.canonical     # ".../login", ".../logout"
    prefix = canonical.rpartition("/")[0]
    return prefix or "/"


def _new_session(request: web.Request, name: str) -> str:
    sessions = request.app[SESSIONS]
    now = time.monotonic()
    for token in [t for t, (_, until) in sessions.items() if until <= now]:
        del sessions[token]
    while len(sessions) >= MAX_SESSIONS:
        del sessions[next(iter(sessions))]
    token = secrets.token_urlsafe(32)
    sessions[token] = (name, now + request.app[SESSION_S])
    return token


def _file(name: str) -> bytes:
    return resources.files("berth.daemon.board_web").joinpath("static", name).read_bytes()


async def index(request: web.Request) -> web.Response:
    return web.Response(body=_file("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _FILES:
        raise web.HTTPNotFound(reason=f"no board file {name!r}")
    return web.Response(body=_file(name), content_type=_FILES[name], charset="utf-8")


def _hello(request: web.Request) -> dict:
    hub = request.app[HUB]
    who = operator_of(request)
    return {"operator": who is not None, "who": who, "up": hub.up,
            "history": hub.full_history(), "window_s": hub.window_s}


async def state(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    return web.json_response({**_hello(request), "board": hub.snapshot})


async def metrics(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    try:
        body = await hub.source.metrics(hub.waits)
    except (OSError, ValueError) as e:        # the gateway's board: berthd is not answering
        raise web.HTTPServiceUnavailable(reason=f"berthd's metrics cannot be read: {e}") from None
    return web.Response(body=body, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus": "0.0.4", "Cache-Control": "no-store"})


async def events(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    await resp.prepare(request)

    async def send(kind: str, doc) -> None:
        await resp.write(f"event: {kind}\ndata: {json.dumps(doc, default=str)}\n\n".encode())

    await resp.write(b"retry: 1000\n\n")
    await send("hello", _hello(request))
    seen = -1
    try:
        while not hub.closing:
            if hub.version > seen and hub.snapshot is not None:
                seen = hub.version
                await send("board", {**hub.snapshot, "up": hub.up})
            else:
                await resp.write(b": keep-alive\n\n")     # notices a page gone
            await hub.changed(seen, 15.0)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return resp


async def _body(request: web.Request) -> dict:
    """The body as a JSON object. Raises 400 (not JSON, not an object), 408 (not all in within
    :data:`_BODY_WAIT_S`), 413 (over the app's limit); :func:`_headers` makes them JSON."""
    try:
        async with asyncio.timeout(_BODY_WAIT_S):
            doc = await request.json()
    except TimeoutError:
        got, length = request.content.total_bytes, request.content_length
        log.warning("board: %s %s from %s: its body did not arrive in %g s (%d of %s bytes)",
                    request.method, request.path, request.remote, _BODY_WAIT_S, got, length)
        raise web.HTTPRequestTimeout(reason=f"body: {got} of {length} bytes arrived in "
                                     f"{_BODY_WAIT_S:g} s") from None
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(reason="body: expected a JSON object, got text that is not "
                                 "JSON") from None
    except RecursionError:
        raise web.HTTPBadRequest(reason="body: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise web.HTTPBadRequest(reason=f"body: expected a JSON object, got a JSON "
                                 f"{type(doc).__name__}")
    return doc


def _err(status: int, msg: str) -> web.Response:
    return web.json_response({"error": msg}, status=status)


async def login(request: web.Request) -> web.Response:
    """``{"name", "key"}`` -> a session cookie. Every error is JSON ``{"error"}`` naming the
    field: 400 (body, name, key missing or not a string), 403 (no key set, wrong key); the key
    given is never said back nor logged, even when it came as the name."""
    key = request.app[KEY]
    doc = await _body(request)
    name = doc.get("name")
    if isinstance(name, str) and key and hmac.compare_digest(name, key):
        return _err(400, "name: that is the board's key; it goes in the key field")
    if not isinstance(name, str) or not _NAME.match(name):
        shown = "none" if name is None else repr(name)[:60]
        return _err(400, f"name: 1 to 40 letters, digits or ._@- , got {shown}")
    if not key:
        return _err(403, "this board has no operator key ([board] key in berth.toml)")
    given = doc.get("key")
    if not isinstance(given, str) or not given:
        what = "none" if given is None else "an empty string" if given == "" else \
            f"a JSON {type(given).__name__}"
        return _err(400, f"key: the board's key ([board] key in berth.toml), a string, is "
                    f"required; got {what}")
    if not hmac.compare_digest(given, key):
        log.warning("board: operator login as %s from %s refused (wrong key)", name,
                    request.remote)
        return _err(403, "key: wrong key")
    log.info("board: operator %s logged in from %s", name, request.remote)
    resp = web.json_response({"operator": True, "who": name})
    resp.set_cookie(COOKIE, _new_session(request, name), httponly=True, samesite="Strict",
                    path=_cookie_path(request), max_age=int(request.app[SESSION_S]))
    return resp


async def logout(request: web.Request) -> web.Response:
    token = request.cookies.get(COOKIE)
    who = request.app[SESSIONS].pop(token, None) if token else None
    if who is not None:
        log.info("board: operator %s signed out from %s", who[0], request.remote)
    resp = web.json_response({"operator": False})
    resp.del_cookie(COOKIE, path=_cookie_path(request))
    return resp


async def operator(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    op = request.match_info["op"]
    who = operator_of(request)
    if who is None:
        log.warning("board: operator %s from %s refused (no key)", op, request.remote)
        return _err(403, "operator actions need the board's key ([board] key in berth.toml)")
    if who != "bearer key" and request.headers.get("X-Berth-Board") != "1":
        # Signed in, but without the header the board's page sends (the cross-site guard): a
        # script is told what is missing, not that its key is (a new user's report).
        log.warning("board: operator %s from %s refused (no X-Berth-Board header)", op,
                    request.remote)
        return _err(403, "a signed-in operator action needs the header X-Berth-Board: 1 (the "
                         "board's page sends it; a guard against cross-site requests), or "
                         "Authorization: Bearer with the key instead of the session")
    if op not in OPS:
        return _err(404, f"operator action {op!r}: expected one of {', '.join(OPS)}")
    doc = await _body(request)
    target = doc.get("target")
    if not isinstance(target, str) or not target:
        return _err(400, f"target: a lease id or engine name, got {target!r}")
    try:
        answer = await hub.source.operator(op, target)
    except KeyError as e:
        # e.args[0], not str(e): str() of a KeyError is its repr, quotes around the text.
        return _err(404, str(e.args[0]) if e.args else "not found")
    except ValueError as e:
        return _err(409, str(e))
    said = "; ".join(answer.get("notes") or []) or "done"
    log.info("board: operator %s from %s: %s %s (%s)", who, request.remote, op, target, said)
    hub.note_operator(who, request.remote or "?", op, target, said)
    asyncio.get_running_loop().create_task(hub.refresh())
    return web.json_response({**answer, "by": who})


def board_app(hub: Hub, key: str | None = None, session_s: float = 8 * 3600.0
              ) -> web.Application:
    """The board as an aiohttp application reading ``hub``; operator actions need ``key``
    (none: the board is read-only for everyone); a sign-in lasts ``session_s`` seconds. Its
    ``on_shutdown`` ends the streams."""
    app = web.Application(middlewares=[_headers], client_max_size=MAX_BODY_BYTES)
    app[HUB] = hub
    app[KEY] = key or ""
    app[SESSIONS] = {}
    app[SESSION_S] = float(session_s)
    r = app.router
    r.add_get("/", index)
    r.add_get("/static/{name}", static)
    r.add_get("/state", state)
    r.add_get("/events", events)
    r.add_get("/metrics", metrics)
    r.add_post("/login", login)
    r.add_post("/logout", logout)
    r.add_post("/operator/{op}", operator)
    return app
