"""The gateway's shortest way, as the front's (:mod:`berth.front.fast`): an OpenAI request
forwarded from the parser's callback, with no task.

When a request's small body is complete, names its model in JSON, carries no peer signature,
and the machine that answers it first is this one with a kept-alive connection to the engine's
front idle, the gateway writes the request at once, in the same turn of the event loop that read
it, and finishes the exchange in the connection's ``on_settled`` callback. Everything else (a
peer, a new connection, a spooled body, an error to answer, a try that failed before any byte)
takes :func:`berth.gateway.route.openai` in the connection's task, which then starts again from
the request as it was (its body is still in ``req.parts``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import orjson
from berth.front.upstream import EngineFailed
from berth.gateway.relay import RelayConnection, Target, end_cut
from berth.gateway.views import candidates

if TYPE_CHECKING:
    from berth.front.server import ClientConnection, Request
    from berth.front.upstream import Address
    from berth.gateway.server import Gateway

__all__ = ["fast"]

_POSTS = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"})
# A signed request, or one from a browser page (its Origin is checked in the task: issue 36).
_SIGNED = frozenset({b"x-berth-signature", b"x-berth-peer", b"origin"})


def fast(gw: "Gateway", req: "Request", client: "ClientConnection") -> bool:
    """Forward ``req`` now if the shortest way applies; False when the task must."""
    if req.method != b"POST" or req.target not in _POSTS:
        return False
    for name, _ in req.headers:
        if name.lower() in _SIGNED:
            return False
    body = b"".join(req.parts)    # kept in req.parts: the task starts from it if need be
    try:
        # orjson, not json: measured in the gateway under bench/gateway.py at concurrency 1,
        # json.loads took 16 us (p50) of the request's way to the front, orjson a few. What
        # orjson refuses (UTF-16, NaN, lone surrogates) takes the task's way (json), as before.
        doc = orjson.loads(body)
        model = doc["model"]
    except (ValueError, RecursionError, TypeError, KeyError):
        return False
    if not isinstance(model, str):
        return False
    route = gw.table.find(model)
    if route is None or not route.target:
        return False
    if gw.peers is not None:
        cands, _ = candidates(gw, model)
        if not cands or not cands[0].local:
            return False
    addr = gw.address(route.target)
    conn = gw.pool.take(addr)
    if conn is None:
        return False
    assert isinstance(conn, RelayConnection)
    # The request leaves first and the exchange is tied up after: the front starts on it while
    # this process counts it (its answer is read on a later turn of the loop, never before).
    conn.write(b"%s %s%s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
        req.method, addr.prefix, req.target, addr.host_line, b"".join(req.lines), len(body),
        body))
    inf = gw.table.in_flight
    inf[route.name] = inf.get(route.name, 0) + 1
    gw.served_local += 1
    conn.relay(client, req, extra=gw.machine_line, src=b"engine", gap_s=route.read_timeout_s,
               on_settled=functools.partial(_done, gw, req, client, conn, addr, route))
    client.exchange = conn
    gw.relays.live.add(conn)
    return True


def _done(gw: "Gateway", req: "Request", client: "ClientConnection", conn: RelayConnection,
          addr: "Address", route, outcome: bool | EngineFailed | None) -> None:
    """The exchange ended: answered (``outcome`` True: the connection is reusable), failed
    (an :class:`EngineFailed`), or None: the client went."""
    client.exchange = None
    gw.relays.live.discard(conn)
    gw.table.in_flight[route.name] -= 1
    keep = req.version != "1.0"
    if isinstance(outcome, EngineFailed):
        conn.close()
        if not conn.sent:    # nothing reached the client: the task tries again, in full
            gw.served_local -= 1
            client.run_queue()
            return
        keep = end_cut(conn, client, outcome, Target(gw.machine, addr)).keep
    elif outcome is None:    # the client went (ClientConnection.connection_lost)
        conn.close()
        keep = False
    elif outcome and not conn.closed:
        gw.pool.release(conn, addr)
    else:
        conn.close()
    client.answered(keep)
