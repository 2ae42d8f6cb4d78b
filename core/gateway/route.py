"""The OpenAI routes: a request goes, by its ``model``, to the machine that answers it first
(:mod:`berth.gateway.choose`), and to the next one when a try fails before any byte of the
answer reached the client (issue 27: "A request not yet answered whose peer goes down is
retried on another machine that serves the model").

What a client is told when no machine answers (issue 27 "Know stopped from unknown"):

=======================================================  ======================================
a peer took the request and went down before answering   504 ``peer_timeout`` (``src: peer``)
the machines that serve it are peers marked down          503 ``peer_down`` (``src: peer``)
its engine here is stopped (a drained lease, an entry     503 ``engine_stopped`` with
whose front is gone), or a name served here or on a       ``Retry-After``
peer before and not now
an entry with no front and no url                         503 ``no_front``
its front here is expected up but cannot be reached       502 ``front_unreachable``
a name nothing here or on a peer has ever served          404 ``model_not_found``
=======================================================  ======================================
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from berth.front.upstream import Address
from berth.gateway.body import MAX_BODY_BYTES, Body, TooLarge
from berth.gateway.choose import DEFAULT_COLD_START_S, Candidate
from berth.gateway.errors import error
from berth.gateway.relay import Target, Tried, attempt
from berth.gateway.signing import Refused
from berth.gateway.views import candidates

if TYPE_CHECKING:
    from berth.front.server import ClientConnection, Request
    from berth.gateway.server import Gateway

__all__ = ["openai", "check_peer"]

log = logging.getLogger("berth.gateway")

_STOPPED = ("not running", "draining", "waiting")
#: An unknown model reads berthd's status again, at most this often (seconds): a client asking
#: for names nothing serves must not become a load on berthd.
_REREAD_S = 0.2


async def openai(gw: "Gateway", req: "Request", client: "ClientConnection") -> bool:
    """``POST`` of an OpenAI route: read the body, check a peer's signature, find the model,
    route. Returns whether the client's connection may carry another request."""
    head = req.method == b"HEAD"
    try:
        body = await Body.read(req)
    except TooLarge as e:
        client.write(error(413, "body_too_large", f"the body is over the gateway's limit of "
                           f"{MAX_BODY_BYTES} bytes ({e.size} bytes)", close=True))
        return False
    try:
        from_peer = check_peer(gw, req, body.digest)
        if isinstance(from_peer, bytes):
            client.write(from_peer)
            return True
        model = _query_model(req)
        if body.model is not None:
            model = body.model
        elif body.invalid is not None:
            client.write(error(400, "model_invalid", f"model: expected a string naming the "
                               f"model, got {body.invalid}", head=head))
            return True
        elif not body.json and model is None:
            client.write(error(400, "invalid_json", "the body is not a JSON object and no "
                               "?model= is given", head=head))
            return True
        if not model:
            client.write(error(400, "model_missing", "model: a request must name the model it "
                               "is for (the JSON field \"model\" or ?model=)", head=head))
            return True
        return await route(gw, req, client, model, body, local_only=from_peer is not None)
    finally:
        body.close()


def _query_model(req: "Request") -> str | None:
    from urllib.parse import parse_qs
    _, _, query = req.target.partition(b"?")
    if not query:
        return None
    got = parse_qs(query.decode("latin-1")).get("model")
    return got[0] if got else None


def check_peer(gw: "Gateway", req: "Request", digest: str) -> str | bytes | None:
    """The peer's machine name for a signed request, a 401 answer for a bad one, None for an
    unsigned one."""
    names = {k.lower() for k, _ in req.headers}
    if b"x-berth-signature" not in names and b"x-berth-peer" not in names:
        return None
    head = req.method == b"HEAD"
    if gw.verifier is None:
        gw.refused += 1
        return error(401, "peers_off", "this gateway takes no peer calls ([network] key is "
                                       "not set)", head=head)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
    try:
        return gw.verifier.verify(req.method_str, req.target.decode("latin-1"), digest,
                                  _Headers(headers))
    except Refused as e:
        gw.refused += 1
        log.warning("gateway: refused a peer call: %s", e)
        return error(401, e.reason, f"peer call refused: {e}", head=head)


class _Headers(dict):
    """Header lookup without regard to case."""

    def __init__(self, raw: dict[str, str]):
        super().__init__({k.lower(): v for k, v in raw.items()})

    def get(self, key, default=None):
        return super().get(key.lower(), default)


async def route(gw: "Gateway", req: "Request", client: "ClientConnection", model: str,
                body: Body, local_only: bool) -> bool:
    """Try the machines that serve ``model``, best first, until one answers."""
    cands, down = candidates(gw, model, local_only)
    if not cands and not down and gw.table.find(model) is None and \
            time.monotonic() - gw.table.read_at > _REREAD_S:
        await gw.table.refresh()       # a run may have registered since the last read
        cands, down = candidates(gw, model, local_only)
    tried: list[tuple[Candidate, Tried]] = []
    for c in cands:
        t = await _try(gw, req, client, c, body)
        if t.answered:
            return t.keep
        tried.append((c, t))
        log.warning("gateway: model %r on %s: not answered (%s: %s)%s", model, c.machine, t.kind,
                    t.why, "; trying the next machine" if c is not cands[-1] else "")
    client.write(_unanswered(gw, req, model, tried, down, local_only))
    return True


async def _try(gw: "Gateway", req: "Request", client: "ClientConnection", c: Candidate,
               body: Body) -> Tried:
    if c.local:
        r = c.ref
        target = Target(gw.machine, gw.address(r.target), gap_s=r.read_timeout_s,
                        extra=gw.machine_line, src=b"engine")
        inf = gw.table.in_flight
        inf[r.name] = inf.get(r.name, 0) + 1
        gw.served_local += 1
        try:
            return await attempt(gw.pool, gw.relays, req, client, target, body)
        finally:
            inf[r.name] -= 1
    peer, pr = c.ref
    net = gw.cfg.network
    target = Target(peer.machine, peer.addr, peer=peer, gap_s=pr.read_timeout_s + net.peer_timeout,
                    connect_s=net.peer_timeout)
    sign = gw.peers.signed(peer, req.method_str, req.target.decode("latin-1"), body.digest)
    lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode("latin-1")) for k, v in sign.items())
    gw.forwarded += 1
    t = await attempt(gw.pool, gw.relays, req, client, target, body, lines)
    if not t.answered and t.kind != "gone":
        gw.peers.mark_down(peer, t.why)
    return t


def _unanswered(gw: "Gateway", req: "Request", model: str, tried: list[tuple[Candidate, Tried]],
                down: list, local_only: bool) -> bytes:
    """The answer when no machine answered (see the module docstring's table)."""
    head = req.method == b"HEAD"
    gone = [c.machine for c, t in tried if not c.local and t.kind == "gone"]
    if gone:
        return error(504, "peer_timeout", f"model {model!r}: {', '.join(gone)} took the request "
                     f"and stopped answering (no answer within the peer timeout of "
                     f"{gw.cfg.network.peer_timeout:g} s)", src="peer", head=head)
    peers_down = sorted({p.machine or p.url for p in down} |
                        {c.machine for c, _ in tried if not c.local})
    if peers_down:
        return error(503, "peer_down", f"model {model!r} is served by {', '.join(peers_down)}, "
                     f"which does not answer; retried after {gw.peers.retry_s:g} s",
                     src="peer", head=head, retry_after_s=math.ceil(gw.peers.retry_s))
    r = gw.table.find(model)
    local = [(c, t) for c, t in tried if c.local]
    if local and r is not None and r.state not in _STOPPED:
        why = "; ".join(t.why for _, t in local)
        return error(502, "front_unreachable", f"model {model!r}: its front cannot be reached "
                     f"({why})", head=head)
    if r is not None and not r.target:
        return error(503, "no_front", f"model {model!r} is an engine on {gw.machine} "
                     f"({r.state}) with no front or url to send requests to: run it with "
                     f"`berth run --engine {r.name} --front HOST:PORT -- ...`, or give its "
                     f"entry a url", head=head)
    if r is not None or gw.table.knows(model) or \
            (not local_only and gw.peers is not None and model in gw.peers.seen):
        return _stopped(gw, model, r, head)
    known = sorted({x.name for x in gw.table.routes} |
                   {x.name for p in (gw.peers.peers if gw.peers else ()) for x in p.routes})
    return error(404, "model_not_found", f"model {model!r} is served by no engine here"
                 + ("" if local_only else " or on a peer")
                 + (f"; known: {', '.join(known)}" if known else "; no engine is known"),
                 head=head)


def _stopped(gw: "Gateway", model: str, r, head: bool) -> bytes:
    name = r.name if r is not None else model
    cold = (gw.table.costs.get(name) or {}).get("cold_start_s")
    wait = math.ceil(cold) if cold else int(DEFAULT_COLD_START_S)
    state = f" ({r.state})" if r is not None else ""
    return error(503, "engine_stopped", f"model {model!r} is served by an engine that is "
                 f"stopped{state}: its lease ended (drained or stopped) and no front takes "
                 f"requests for it now; it answers again once its engine runs", head=head,
                 retry_after_s=max(1, wait))


def address(cache: dict[str, Address], url: str) -> Address:
    """``url`` parsed once (a route's target changes seldom)."""
    a = cache.get(url)
    if a is None:
        if len(cache) > 1024:
            cache.clear()
        a = cache[url] = Address(url)
    return a
