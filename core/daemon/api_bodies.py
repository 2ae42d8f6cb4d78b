"""The control API's requests and answers: request bodies as pydantic models (a lease request
filled from its engine's berth.toml entry: :func:`with_entry`), query numbers, and the one JSON
error shape every answer takes.

Source: issue 4 "The control API". A malformed call gets a 4xx JSON error naming the field and
value (``{"error": {"type", "code", "message"}, "src": "berthd"}``), never a crash.
"""

from __future__ import annotations

import asyncio
import logging
import reprlib
from typing import TYPE_CHECKING, Annotated, Any, Mapping

from aiohttp import web
from berth.config.errors import in_words, said_once
from berth.config.words import is_secret
from berth.daemon.broker import LeaseGone
from berth.decide.model import DEFAULT_KEEP_WARM_S, MAX_ALIASES, Bound, Op, ParkMechanism
from berth.decide.units import format_size, parse_size
from berth.process import peer_credentials
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError

if TYPE_CHECKING:
    from berth.config.models import EngineConfig

__all__ = ["AttachBody", "JobsBody", "LeaseBody", "NoteBody", "OperatorBody", "ReleaseBody",
           "ReportBody", "ShareBody", "WakeBody", "ClientKey", "BODY_WAIT_S", "error", "errors",
           "known_query", "parse_body", "query_number", "read_json", "with_entry"]

log = logging.getLogger("berth.daemon.api")


def _size_or_card(v: Any) -> int | None:
    return parse_size(v, field="size", allow_card=True)


def _size(v: Any) -> int:
    return parse_size(v, field="size")


def _size_or_none(v: Any) -> int | None:
    return None if v is None else parse_size(v, field="size")


#: The largest pid Linux gives (``pid_max`` at most 2**22).
MAX_PID = 1 << 22
#: A process start time, seconds since the epoch: finite, and before the year 36812.
MAX_START_TIME = float(1 << 40)


class _Body(BaseModel):
    # Every number from outside is bounded before use (issue 36): no infinity, no NaN (JSON's
    # 1e400 parses as infinity), and each field below has a range. Each body's validator is
    # built at its first request, not at berthd's start (a berthd serves few of the kinds:
    # issue 38).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)


#: A front's key for a client (:mod:`berth.front.clients`): a hash, never an address.
ClientKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[0-9a-zA-Z_-]+$")]


class ShareBody(_Body):
    card: str | None = None
    size: Annotated[int | None, BeforeValidator(_size_or_card)]
    need: Annotated[int | None, BeforeValidator(lambda v: None if v is None else _size(v))] = None


class LeaseBody(_Body):
    # Any name without whitespace or control characters: llama-swap model ids such as
    # "Qwen/Qwen2.5-7B" included (lease ids are made safe separately).
    engine: str = Field(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f\x7f]+$")
    shares: list[ShareBody] = Field(default_factory=list, max_length=64)
    bound: Bound = Bound.DECLARED
    growth_allowance: Annotated[int, BeforeValidator(_size)] = 0
    priority: int = Field(0, ge=-1000, le=1000)
    keep_warm: float = Field(DEFAULT_KEEP_WARM_S, ge=0, le=365 * 86400)
    park: ParkMechanism | None = None
    lend: StrictBool = False
    lend_max: Annotated[int | None, BeforeValidator(lambda v: None if v is None else _size(v))] = None
    front: str | None = Field(None, max_length=300)
    # Other model IDs the gateway routes to this engine (llama-swap's aliases; issue 14).
    aliases: list[Annotated[str, Field(min_length=1, max_length=200,
                                       pattern=r"^[^\s\x00-\x1f\x7f]+$")]] = \
        Field(default_factory=list, max_length=MAX_ALIASES)
    owner_pid: int | None = Field(None, gt=0, le=MAX_PID)
    pid: int | None = Field(None, gt=0, le=MAX_PID)
    start_time: float | None = Field(None, ge=0.0, le=MAX_START_TIME)
    host: str | None = Field(None, max_length=100)
    # False: Berth must never stop this process (an in-process host: the ComfyUI node), so it
    # makes room only by its park; no_park: why the host gives no park (issue 24).
    drain: StrictBool = True
    no_park: str | None = Field(None, max_length=300)
    # Why the engine's own command pins its card: Berth never moves it (issue 35).
    pinned: str | None = Field(None, max_length=300)
    # Its checkpoint restores onto another card (cuda-checkpoint --device-map; issue 35).
    restore_across: bool = False
    # Seconds the room is kept when the process exits on its own and its supervisor restarts
    # it (a host that restarts programs says so; issue 12 case 2).
    restart_grace: float = Field(0.0, ge=0.0, le=3600.0)
    # The owner is a child subreaper (``berth run``): every descendant of it other than itself
    # is the engine's, one that double-forked out of the engine's tree included (issue 36).
    reaper: StrictBool = False
    # False: no holder makes room for it; it is granted when room frees by itself (a drained
    # run with no front asking for its card again; issue 35).
    makes_room: StrictBool = True
    # The client key of the held request it asks for, and seconds since it arrived: a drained
    # run asks again for a request its front holds, as a wake does (issue 34).
    client: ClientKey | None = None
    client_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)


def with_entry(engines: Mapping[str, EngineConfig], body: LeaseBody) -> LeaseBody:
    """``body`` with what it left out filled from its engine's ``[engines.<engine>]`` entry of
    berth.toml (``engines``: the config's entries by name; a field the body has is the run
    line's own word and wins). Raises ``HTTPBadRequest`` (400) when no size is given anywhere,
    or for a ``lend_max`` where neither the body nor the entry lends."""
    entry = engines.get(body.engine)
    if entry is None and not body.shares:
        raise web.HTTPBadRequest(reason=f"shares: engine {body.engine!r} has no "
                                        f"[engines.{body.engine}] entry in berth.toml; give "
                                        f"--size SIZE[@CARD]")
    if entry is not None:
        given = body.model_fields_set
        upd: dict = {}
        if not body.shares:
            upd["shares"] = [ShareBody(card=entry.card, size=entry.size, need=entry.need)]
        for name, value in (("priority", entry.priority), ("bound", entry.bound),
                            ("growth_allowance", entry.growth_allowance), ("lend", entry.lend),
                            ("lend_max", entry.lend_max), ("front", entry.front),
                            ("park", entry.park), ("keep_warm", entry.keep_warm)):
            if name not in given:
                upd[name] = value
        body = body.model_copy(update=upd)
    if body.lend_max is not None and not body.lend:
        # A cap on lending with no lending: taken, it meant nothing and hid the missing --lend.
        raise web.HTTPBadRequest(reason=f"lend_max: {format_size(body.lend_max)} given but "
                                        f"engine {body.engine!r} does not lend; give --lend, or "
                                        f"set lend = true in [engines.{body.engine}]")
    return body


class AttachBody(_Body):
    pid: int = Field(gt=0, le=MAX_PID)
    start_time: float | None = Field(None, ge=0.0, le=MAX_START_TIME)
    host: str | None = Field(None, max_length=100)


class JobsBody(_Body):
    """``POST /v1/leases/{id}/jobs``: ``in_flight`` requests the front has (forwarded or held),
    ``oldest_age_s`` seconds since the oldest of them arrived (``None``: not said), ``served``
    the model requests its front has started during this lease, a count that only grows
    (``None``: not said; issue 24: a request answered between two samples of ``in_flight``)."""

    in_flight: int = Field(ge=0, le=1_000_000)
    oldest_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)
    served: int | None = Field(None, ge=0, le=2**53)
    #: the client key of the oldest of those requests (issue 34)
    client: ClientKey | None = None
    #: the client key of the front's last answer, and seconds since it ended (issue 34)
    answered_client: ClientKey | None = None
    answered_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)
    #: how many of ``in_flight`` the front holds, not yet forwarded, and seconds since the
    #: oldest of them arrived (issue 34, the fence; ``None``: not said)
    held: int | None = Field(None, ge=0, le=1_000_000)
    oldest_held_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)


class WakeBody(_Body):
    """``POST /v1/leases/{id}/wake``: the client key of the held request that asks, and
    seconds since it arrived (issue 34: an idle holder whose last answer went to that client
    yields at once). Both optional; an empty body asks for the wake alone."""

    client: ClientKey | None = None
    client_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)


class ReportBody(_Body):
    op: Op
    ok: StrictBool                      # "yes" or 1 is not a verdict
    detail: str = Field("", max_length=2000)


class ExtendBody(_Body):
    """``POST /v1/leases/{id}/extend``: ``bytes`` more, asked for before the growth;
    ``to_bytes``: the reservation the asker needs in all, so that berthd asks only what its
    reservation lacks of it (the asker's copy may be behind a growth berthd extended on its own)."""

    bytes: Annotated[int, BeforeValidator(_size)] = Field(gt=0)
    to_bytes: Annotated[int | None, BeforeValidator(_size_or_none)] = Field(None, gt=0)
    card: str | None = None
    #: the client key of the request that needs the room, and seconds since it arrived
    #: (issue 34: as for a wake, an idle holder whose last answer went to it yields at once)
    client: ClientKey | None = None
    client_age_s: float | None = Field(None, ge=0.0, le=366 * 86400.0)


class OperatorBody(_Body):
    target: str = Field(min_length=1, max_length=300)


class ReleaseBody(_Body):
    reason: str = Field("released", max_length=500)


class NoteBody(_Body):
    """``POST /v1/notes``: a host says something about an engine it manages that has no lease
    to carry it (issue 37: a supervisord program that died for lack of memory)."""

    engine: str = Field(min_length=1, max_length=200, pattern=r"^[^\s\x00-\x1f\x7f]+$")
    text: str = Field(min_length=1, max_length=500)



def error(status: int, message: str, kind: str = "invalid_request", **extra) -> web.Response:
    """The one error shape: ``{"error": {"type", "code", "message", **extra}, "src": "berthd"}``."""
    return web.json_response({"error": {"type": kind, "code": status, "message": message, **extra},
                              "src": "berthd"}, status=status)


#: Seconds a request body may take to arrive after its head (``[listeners] idle_timeout``; the
#: app's value, else :data:`DEFAULT_BODY_WAIT_S`).
BODY_WAIT_S = web.AppKey("body_wait_s", float)
DEFAULT_BODY_WAIT_S = 60.0


async def read_json(request: web.Request, wait_s: float | None = None) -> Any:
    """The request's body parsed as JSON, read within ``wait_s`` seconds (None: the app's
    :data:`BODY_WAIT_S`). A body that has not all arrived by then (a client that sent fewer
    bytes than its Content-Length says, or stopped mid-way) is logged and raises a 408
    (``web.HTTPRequestTimeout``) that says how much came; :func:`errors` closes the connection
    after it. Raises ``ValueError`` for a body that is not JSON, and aiohttp's 413 for one over
    the app's ``client_max_size``."""
    if wait_s is None:
        wait_s = request.app.get(BODY_WAIT_S, DEFAULT_BODY_WAIT_S)
    try:
        async with asyncio.timeout(wait_s):
            return await request.json()
    except TimeoutError:
        got, length = request.content.total_bytes, request.content_length
        of = f"{got} of {length} bytes (its Content-Length)" if length is not None else \
            f"{got} bytes, and no end of it,"
        why = f"body: {of} arrived in {wait_s:g} s; the request is dropped"
        log.warning("%s %s from %s: %s", request.method, request.path, _who(request), why)
        raise web.HTTPRequestTimeout(reason=why) from None


def _who(request: web.Request) -> str:
    """The caller, for the log: its pid and uid on the Unix socket, else its address."""
    t = request.transport
    cred = peer_credentials(t.get_extra_info("socket")) if t is not None else None
    if cred is not None:
        return f"pid {cred[0]} uid {cred[1]}"
    return str(request.remote or "a client")


async def parse_body(request: web.Request, model: type[BaseModel]):
    """Parse and validate a JSON body; raise an HTTP 400 naming each bad field and value (a
    408 for a body that does not arrive: :func:`read_json`)."""
    try:
        raw = await read_json(request) if request.can_read_body else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(reason=f"body is not JSON: {e}") from None
    except RecursionError:
        raise web.HTTPBadRequest(reason="body: JSON nested too deeply") from None
    if not isinstance(raw, dict):
        raise web.HTTPBadRequest(reason=f"body must be a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except RecursionError:
        raise web.HTTPBadRequest(reason="body: JSON nested too deeply") from None
    except ValidationError as e:
        problems = "; ".join(_problem(err) for err in e.errors()[:10])
        raise web.HTTPBadRequest(reason=problems[:4000]) from None


def _problem(err: dict) -> str:
    """One validation error: ``key.path: message (got value)``, the key said once. The value is
    repeated only for a field the body knows whose name is not a secret's: a misspelled field
    may be a key sent under the wrong name, and it would land in the log (issue 36)."""
    key = ".".join(str(x) for x in err["loc"]) or "(body)"
    said = said_once(key, in_words(err))
    last = err["loc"][-1] if err["loc"] else ""
    if err["type"] in ("extra_forbidden", "missing") or is_secret(last):
        return f"{key}: {said}"
    shown = _show(err.get("input"))
    return f"{key}: {said}" if said.endswith(f"got {shown}") else f"{key}: {said} (got {shown})"


def _show(value: Any) -> str:
    """A short, safe rendering of a client's value for an error message."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 120, 120


#: The query parameters each route takes (``(method, route)``); a route not named takes none.
#: ``/metrics`` is left out: Prometheus's ``name[]`` filter is prometheus-client's to read.
QUERY = {
    ("GET", "/v1/leases/{id}/grant"): {"timeout", "wait_version"},
    ("GET", "/v1/leases/{id}/instructions"): {"after", "timeout", "wait_version"},
    ("POST", "/v1/leases/{id}/release"): {"wait"},
    ("GET", "/v1/timeline"): {"after", "timeout"},
    ("GET", "/v1/drained/{engine}/wake"): {"timeout"},
}
#: Sequence numbers (``after``): whole, not a number of any kind.
WHOLE = {"after", "wait_version"}


@web.middleware
async def known_query(request: web.Request, handler):
    """A query parameter the route does not take is a 400 naming it and its value (a new user's
    ``/v1/timeline?since=abc`` was a 200 with the whole timeline), and so is a sequence
    number that is not whole."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "/metrics"   # a 404 stays a 404
    if route != "/metrics":
        takes = QUERY.get((request.method, route), set())
        for name, raw in request.query.items():
            if name not in takes:
                said = f"it takes {', '.join(sorted(takes))}" if takes else "it takes none"
                raise web.HTTPBadRequest(reason=f"{name}: not a query parameter of "
                                                f"{request.method} {route} ({said}); got {raw!r}")
            if name in WHOLE and not raw.isdigit():
                raise web.HTTPBadRequest(reason=f"{name}: expected a whole number, got {raw!r}")
    return await handler(request)


def query_number(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    """The query parameter ``name`` as a number in ``[lo, hi]`` (``default`` when absent).
    Raises :class:`aiohttp.web.HTTPBadRequest` naming it and the value otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(reason=f"{name}: expected a number, got {raw!r}") from None
    if not lo <= v <= hi or v != v:
        raise web.HTTPBadRequest(reason=f"{name}: must be between {lo} and {hi}, got {raw!r}")
    return v


@web.middleware
async def errors(request: web.Request, handler):
    """Every answer is JSON in one shape; nothing a client sends can cause a 5xx."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if isinstance(e, web.HTTPRequestEntityTooLarge):
            # Its text says the limit; its reason phrase does not.
            return error(413, f"body: {e.text}")
        resp = error(e.status, e.reason or e.text or "error")
        if isinstance(e, web.HTTPRequestTimeout):
            resp.force_close()      # the rest of the body may still come: the connection ends
        return resp
    except KeyError as e:
        return error(404, str(e.args[0]) if e.args else "not found", "not_found")
    except LeaseGone as e:
        return error(410, e.reason, "gone")
    except ValueError as e:
        return error(409, str(e), "conflict")
    except asyncio.CancelledError:
        raise
    except Exception as e:        # a bug: say so without crashing the daemon
        log.exception("request %s %s failed", request.method, request.path)
        return error(500, f"internal error: {type(e).__name__}", "internal")


