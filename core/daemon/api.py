"""The control API: HTTP with JSON on a Unix socket (and, with a key, on TCP).

Source: issue 4 "The control API", DESIGN.md. Request bodies are pydantic models; a malformed
call gets a 4xx JSON error naming the field and value, never a crash, and changes nothing.
This module holds the route handlers (the server is :mod:`berth.daemon.api_serve`); the request bodies and error shape are in
``api_bodies``, the peer-credential and attach rules in ``api_claims``, the metrics in
``api_metrics``.

Routes (all JSON; sizes may be strings like ``"14GiB"`` or integers of bytes):

=========================================  =================================================
``POST /v1/leases``                        request a lease → 201 ``{"id", "state", "cards"}``
                                           (``pid``/``start_time``/``host``: adopt a process
                                           that already runs, checked as an attach)
``GET  /v1/leases/{id}/grant?timeout=S``   wait for the grant → ``{"granted", "cards", "rung"}``
``POST /v1/leases/{id}/attach``            ``{"pid", "start_time"}``: the engine's process
``POST /v1/leases/{id}/report``            ``{"op", "ok", "detail"}``: park/wake/lend/return/drain
``GET  /v1/leases/{id}/instructions``      long-poll ``?after=SEQ&timeout=S`` → instructions
``POST /v1/leases/{id}/wake``              a front holds a write for this lease (``{"client",
                                           "client_age_s"}``: whose, and since when; issue 34)
``DELETE /v1/leases/{id}/wake``            the writes that asked for it have all gone
``POST /v1/leases/{id}/extend``            ``{"bytes", "to_bytes"?, "card"?}``: room to grow,
                                           asked before the growth (202; the reservation grows
                                           once the ladder made room: ``api_extend``)
``DELETE /v1/leases/{id}/extend``          that request is no longer wanted (``api_extend``)
``POST /v1/leases/{id}/touch``             the engine served a request
``POST /v1/leases/{id}/jobs``              ``{"in_flight", "oldest_age_s", "served", "client",
                                           "answered_client", "answered_age_s"}``: requests its
                                           front has now and has started this lease, and whose
``POST /v1/leases/{id}/ready``             the engine answers: its minimum turn starts
``POST /v1/leases/{id}/release``           the run is done (``?wait=S``: until the driver
                                           confirms the memory free)
``GET  /v1/leases/{id}``                   one lease
``POST /v1/operator/{op}``                 ``{"target"}``: park, wake, drain, hold, release-hold
                                           (wake on a drained run: it asks for its card
                                           again; the others a 409, :mod:`.drained`)
``GET  /v1/status``                        the board (``berth status --json``)
``GET  /v1/timeline?after=SEQ&timeout=S``  timeline entries (long-poll)
``GET  /metrics``                          Prometheus text
=========================================  =================================================

A query parameter a route does not take (``/v1/timeline?since=...``) is a 400 naming it and
its value, and so is a sequence number (``after``, ``wait_version``) that is not whole
(:func:`~berth.daemon.api_bodies.known_query`).

Names are owned (issue 26, :mod:`berth.daemon.owners`): a lease for a name or a front the
caller may not use is a 403, and the status says of each lease whether it passes
(``owner_checked``, ``front_checked``). Every lease verb is its owner's or an operator's (403).

Who may claim a process: the peer's credentials (``SO_PEERCRED``) are recorded; an attach is
allowed only if the caller is that process, or its parent, or a host plugin vouches for it
(``berth_vouch``). Any other attach is refused (403) and logged.

Adopting (issue 7): a host plugin's observe mode leases a process its host already started
(supervisord). The request then names ``pid`` (with ``start_time`` and ``host``); it is checked
exactly as an attach, the lease is born attached to that process (which also owns it), its card
is the one where the process tree already holds memory (unless the request names one), and that
memory counts as the waiter's own at admission (``Ledger.available``), so the lease waits only
if the process does not fit beside the others.
"""

from __future__ import annotations

import asyncio
import logging
import os

import psutil
from aiohttp import web
from berth.daemon import owners
from berth.daemon.api_bodies import (
    BODY_WAIT_S,
    AttachBody,
    JobsBody,
    LeaseBody,
    NoteBody,
    OperatorBody,
    ReleaseBody,
    ReportBody,
    WakeBody,
    error,
    errors,
    known_query,
    parse_body,
    query_number,
    with_entry,
)
from berth.daemon.api_claims import (
    auth,
    caller_of_request,
    claim,
    is_operator,
    is_self_or_descendant,
    may_act,
    may_release,
    peer_of,
    priority_cap,
)
from berth.daemon.api_drained import add_routes as add_drained_routes
from berth.daemon.api_extend import add_routes as add_extend_routes
from berth.daemon.api_scrape import SCRAPE, Scrape, metrics
from berth.daemon.broker import Broker, LeaseGone
from berth.daemon.drained import DrainedRuns, find_target, wake_drained
from berth.decide.model import Capabilities, Lease, ParkMechanism
from berth.decide.placement import Ask, PlacementError
from berth.decide.units import format_size
from berth.driver.base import DriverError
from berth.process import ProcessId, identify

__all__ = ["make_app"]

log = logging.getLogger("berth.daemon.api")
BROKER = web.AppKey("broker", Broker)
#: lease id -> the model IDs its run asked the gateway to route to it besides the engine name.
ALIASES = web.AppKey("aliases", dict)
#: lease id -> who asked for it, ``(pid, uid, gid)``: the holder of its names (issue 26).
CALLERS = web.AppKey("callers", dict)


def _lease(broker: Broker, lease_id: str) -> Lease:
    lease = broker.sched.ledger.leases.get(lease_id)
    if lease is None:
        ch = broker.channels.get(lease_id)
        if ch is not None and ch.ended is not None:
            raise LeaseGone(lease_id, ch.ended)
        raise KeyError(f"lease {lease_id!r}: not known")
    return lease


def _cards_json(broker: Broker, cards: dict[str, int]) -> list[dict]:
    led = broker.sched.ledger
    # free_bytes: the card's last driver read, so that a run can bound an engine that sizes
    # itself to what is free (llama-server's --fit-target; issue 37).
    return [{"pci": p, "name": led.cards[p].name, "uuid": broker.uuids.get(p), "bytes": b,
             "free_bytes": led.cards[p].free_bytes}
            for p, b in cards.items()]


# -- handlers ----------------------------------------------------------------------------------
async def request_lease(request: web.Request) -> web.Response:
    """``POST /v1/leases``. The checks that need no lease state run here (the caller's priority
    cap, a front for park and lend, the claim of an adopted process, the owner; what berth.toml
    fills and its checks: :func:`with_entry`); the card of each share is chosen inside the
    single writer (:meth:`Broker.request`)."""
    broker = request.app[BROKER]
    body: LeaseBody = await parse_body(request, LeaseBody)
    body = with_entry(broker.cfg.engines, body)
    refused = owners.names_refused(broker, request, body.engine, [body.engine, *body.aliases],
                                   body.front, request.app[ALIASES], request.app[CALLERS])
    if refused is not None:
        return refused
    peer = peer_of(request)
    refusal = _over_priority_cap(broker, body, peer) or owners.second_run(
        broker, body.engine, body.owner_pid or (peer[0] if peer else None))
    if refusal is not None:
        return refusal
    if (body.park or body.lend) and not body.front:
        raise web.HTTPBadRequest(reason="front: park and lend need a front (rule 3); "
                                        "give --front HOST:PORT")
    adopted = None
    if body.pid is not None:
        adopted, refusal, why = await claim(broker, request, body.pid, body.start_time,
                                            body.engine, body.host)
        if refusal is not None:
            return refusal
    lease = _new_lease(broker, body, adopted, _owner(body, peer, adopted))
    request.app[CALLERS][lease.id] = caller_of_request(request)
    asks = [Ask(sb.card, sb.size, sb.need) for sb in body.shares]
    try:
        await broker.request(lease, asks, body.client, body.client_age_s)
    except PlacementError as e:
        raise web.HTTPBadRequest(reason=str(e)) from None
    except DriverError as e:
        return error(503, f"cannot read the cards to adopt pid {lease.pid}: {e}", "unavailable")
    if adopted is not None:
        log.info("lease %s adopts pid %s (%s), which holds %s", lease.id, adopted.pid, why,
                 ", ".join(f"{p}={format_size(s.used_bytes)}" for p, s in lease.shares.items()))
    if body.aliases:
        request.app[ALIASES][lease.id] = list(body.aliases)
    state = "waiting" if lease.is_waiting() else "active"
    if lease.id not in broker.sched.ledger.leases:
        ch = broker.channels.get(lease.id)
        return error(409, ch.ended if ch and ch.ended else "rejected", "rejected", id=lease.id)
    return web.json_response({"id": lease.id, "state": state, "policy": _limits(broker),
                              "cards": _cards_json(broker, {p: s.size_bytes
                                                            for p, s in lease.shares.items()})},
                             status=201)


def _over_priority_cap(broker: Broker, body: LeaseBody, peer) -> web.Response | None:
    """A 403 when the caller asks more priority than berth.toml allows it, else ``None``."""
    cap = priority_cap(broker.cfg, body.engine, peer)
    if cap is None or body.priority <= cap:
        return None
    log.warning("lease for %s by uid %s refused: priority %s over %s", body.engine,
                peer[1] if peer else None, body.priority, cap)
    return error(403, f"priority: {body.priority} is more than the {cap} berth.toml allows "
                      f"uid {peer[1]} for engine {body.engine!r} ([engines.{body.engine}] "
                      f"max_priority, [api] max_priority); an operator may ask more",
                 "forbidden")


def _owner(body: LeaseBody, peer, adopted: ProcessId | None) -> ProcessId | None:
    """The process whose life the lease's follows. Raises 400 for an ``owner_pid`` that is not
    alive or not the caller's own."""
    if adopted is not None and body.owner_pid is None:
        return adopted                  # the lease lives as long as the process it adopted
    # A host that adopts a process may own the lease itself: it may then release it, and
    # the lease outlives the process for a restart hold (the PID decides while it is set).
    owner_pid = body.owner_pid or (peer[0] if peer else None)
    owner = identify(owner_pid) if owner_pid else None
    if body.owner_pid is not None:
        # The owner ties the lease's life to a process: it must be alive, and the caller
        # must be it or one of its ancestors (a lease owned by pid 1 would never end).
        if owner is None:
            raise web.HTTPBadRequest(reason=f"owner_pid: no live process {body.owner_pid}")
        if peer is not None and not is_self_or_descendant(owner.pid, peer[0]):
            raise web.HTTPBadRequest(reason=f"owner_pid: {owner.pid} is neither the caller "
                                            f"({peer[0]}) nor a process it started")
    return owner


def _new_lease(broker: Broker, body: LeaseBody, adopted: ProcessId | None,
               owner: ProcessId | None) -> Lease:
    """The lease a request asks for, with no share yet: the scheduler places them."""
    entry = broker.cfg.engines.get(body.engine)
    return Lease(id=broker.new_lease_id(body.engine), engine=body.engine, shares={},
                 priority=body.priority, bound=body.bound,
                 growth_allowance_bytes=body.growth_allowance, keep_warm_s=body.keep_warm,
                 caps=Capabilities(park=ParkMechanism(body.park) if body.park else None,
                                   lend=body.lend, lend_max_bytes=body.lend_max,
                                   front=body.front, drain=body.drain, no_park=body.no_park,
                                   pinned=body.pinned,
                                   restore_across=body.restore_across),
                 owner_pid=owner.pid if owner else None,
                 owner_start_time=owner.start_time if owner else None,
                 # Its owner's descendants are its engine's (issue 36).
                 reaper=body.reaper and owner is not None,
                 pid=adopted.pid if adopted else None,
                 start_time=adopted.start_time if adopted else None,
                 restart_grace_s=body.restart_grace, makes_room=body.makes_room,
                 max_job_s=entry.max_job if entry is not None else None,
                 may_preempt=entry.preempt if entry is not None else False)


async def wait_grant(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    timeout = query_number(request, "timeout", 30.0, 0.0, 600.0)
    g = await broker.wait_grant(lid, timeout, _wait_version(request))
    if g is None:
        pos = [w.lease_id for w in broker.sched.queue].index(lid) if lid in broker.sched.queue else None
        return web.json_response({"granted": False, "queue_position": pos,
                                  "wait": _wait(broker, lid)})
    return web.json_response({"granted": True, "cards": _cards_json(broker, g.cards), "rung": g.rung,
                              "driver": {"kind": broker.driver.kind, "sim_dir": broker.sim_dir},
                              "policy": _limits(broker)})


def _wait_version(request: web.Request) -> int | None:
    """``?wait_version=N``: the version of the lease's wait the caller knows; a long poll then
    returns as soon as it changes (issue 12 case 6)."""
    raw = request.query.get("wait_version")
    if raw is None:
        return None
    if not raw.isdigit():
        raise web.HTTPBadRequest(reason=f"wait_version: expected a whole number, got {raw!r}")
    return int(raw)


def _wait(broker: Broker, lid: str) -> dict:
    """Why the lease (or its wake) waits: ``{"why", "lasting", "version"}``; ``why`` is
    ``None`` when it does not wait. ``lasting``: nothing under way can change it, so a front
    answers a held request at once."""
    ch = broker.channels.get(lid)
    return dict(ch.wait) if ch is not None else {"why": None, "lasting": False, "version": 0}


def _limits(broker: Broker) -> dict:
    """The time limits (seconds) a run takes from berthd unless its own line sets them."""
    p = broker.cfg.policy
    return {"wait_limit_s": p.wait_limit, "release_grace_s": p.release_grace,
            "wake_limit_s": p.wake_limit}



def _not_owner(lease: Lease, request: web.Request, what: str) -> web.Response | None:
    """A 403 unless the caller owns ``lease`` (:func:`api_claims.may_report`) or is an
    operator (:func:`api_claims.is_operator`): every lease verb asks this (issue 26)."""
    ok, why = may_act(request.app[BROKER].cfg, lease, peer_of(request))
    if ok:
        return None
    log.warning("%s lease %s refused: %s", what.split()[0], lease.id, why)
    return error(403, f"{what} lease refused: {why}", "forbidden")


async def attach(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    body: AttachBody = await parse_body(request, AttachBody)
    lease = _lease(broker, lid)
    refused = _not_owner(lease, request, "attach to")
    if refused is not None:
        return refused
    actual, refusal, why = await claim(broker, request, body.pid, body.start_time, lease.engine,
                                       body.host)
    if refusal is not None:
        return refusal
    await broker.submit(lambda now: broker.sched.attach(lid, actual.pid, actual.start_time, now))
    return web.json_response({"id": lid, "pid": actual.pid, "start_time": actual.start_time,
                              "why": why})



async def report(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    body: ReportBody = await parse_body(request, ReportBody)
    refused = _not_owner(_lease(broker, lid), request, "report on")
    if refused is not None:
        return refused
    broker.reported(lid, body.op)
    await broker.submit(lambda now: broker.sched.report(lid, body.op, body.ok, now, body.detail))
    return web.json_response({"id": lid, "op": body.op, "ok": body.ok})


async def instructions(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    after = int(query_number(request, "after", 0, 0, 2**62))
    timeout = query_number(request, "timeout", 25.0, 0.0, 600.0)
    if lid not in broker.channels:
        raise KeyError(f"lease {lid!r}: not known")
    ins, ended = await broker.instructions(lid, after, timeout, _wait_version(request))
    lease = broker.sched.ledger.leases.get(lid)
    pids = sorted({p for ps in broker.lease_pids.get(lid, {}).values() for p in ps})
    return web.json_response({
        "instructions": [i.to_wire(broker.clock()) for i in ins],
        "wait": _wait(broker, lid),
        "pids": pids,
        "use": {p: s.used_bytes for p, s in lease.shares.items()} if lease else {},
        "ram_available_bytes": _ram_available(broker, lid),
        "ended": ended,
        "states": {p: s.state.value for p, s in lease.shares.items()} if lease else {},
        # A wake may be placed on other cards (issue 35): the run maps them to UUIDs.
        "cards": {p: {"name": c.name, "uuid": broker.uuids.get(p)}
                  for p, c in broker.sched.ledger.cards.items()}})


def _ram_available(broker: Broker, lease_id: str) -> int | None:
    """Host RAM the park of lease ``lease_id`` may use now (bytes): the RAM budget less what
    other parks already hold (the park's own check adds this one's bytes), and (on real cards)
    never more than the kernel's MemAvailable. Simulated cards park into simulated host RAM, so
    only the configured budget counts there."""
    budget = broker.sched.ledger.ram_available_bytes(for_lease=lease_id)
    if broker.driver.kind == "sim":
        return budget
    real = psutil.virtual_memory().available
    return real if budget is None else min(budget, real)


async def wake(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    lease = _lease(broker, lid)
    refused = _not_owner(lease, request, "wake")
    if refused is not None:
        return refused
    body: WakeBody = await parse_body(request, WakeBody)
    age = body.client_age_s
    await broker.submit(lambda now: broker.sched.wake(
        lid, now, body.client, None if age is None else now - age))
    return web.json_response({"id": lid, "states": {p: s.state.value for p, s in lease.shares.items()},
                              "wait": _wait(broker, lid)})


async def jobs(request: web.Request) -> web.Response:
    """``{"in_flight": N, "oldest_age_s": S, "served": C, "client": K, "answered_client": K,
    "answered_age_s": S, "held": H, "oldest_held_age_s": S}``: the requests the lease's front
    forwards or holds now (issue 12
    case 4), the age of the oldest (issue 16: FIFO turns), how many model requests it has
    started during this lease (issue 24: one answered between two reports still ends the
    first-request hold), and the clients of the oldest request and of the last answer, with
    that answer's age (issue 34: the forecast of whether a request for it comes soon), and how
    many of them it holds, with the oldest held one's age (issue 34: the fence)."""
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    body: JobsBody = await parse_body(request, JobsBody)
    refused = _not_owner(_lease(broker, lid), request, "report the jobs of")
    if refused is not None:
        return refused
    age, done, held_age = body.oldest_age_s, body.answered_age_s, body.oldest_held_age_s
    # An age, not a time, crosses from the run: it becomes a time on berthd's own clock here.
    await broker.submit(lambda now: broker.sched.jobs(
        lid, body.in_flight, now, None if age is None else now - age, body.served,
        body.client, body.answered_client, None if done is None else now - done, body.held,
        None if held_age is None else now - held_age))
    return web.json_response({"id": lid, "in_flight": body.in_flight, "served": body.served})


def _lease_event(event: str):
    """A handler that passes one bodiless lease event (``touch``, ``ready``) to the scheduler."""
    async def handler(request: web.Request) -> web.Response:
        broker = request.app[BROKER]
        lid = request.match_info["id"]
        refused = _not_owner(_lease(broker, lid), request, event)
        if refused is not None:
            return refused
        await broker.submit(lambda now: getattr(broker.sched, event)(lid, now))
        return web.json_response({"id": lid})
    return handler


touch = _lease_event("touch")
ready = _lease_event("ready")



async def unwake(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    refused = _not_owner(_lease(broker, lid), request, "withdraw the wake of")
    if refused is not None:
        return refused
    fx = await broker.submit(lambda now: broker.sched.unwake(lid, now))
    return web.json_response({"id": lid, "withdrawn": any(getattr(e, "kind", "") == "wake.off"
                                                          for e in fx)})


async def release(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    body: ReleaseBody = await parse_body(request, ReleaseBody)
    wait = query_number(request, "wait", 0.0, 0.0, 600.0)
    lease = broker.sched.ledger.leases.get(lid)
    if lease is not None:
        peer = peer_of(request)
        if peer is not None and not may_release(lease, peer[0]):
            log.warning("release of lease %s by pid %s refused", lid, peer[0])
            return error(403, f"release refused: pid {peer[0]} neither owns lease {lid} nor "
                              f"started its engine; an operator drains it instead "
                              f"(berth drain {lease.engine})", "forbidden")
        await broker.submit(lambda now: broker.sched.exited(lid, now, final=True))
    ch = broker.channels.get(lid)
    if ch is None:
        raise KeyError(f"lease {lid!r}: not known")
    deadline = asyncio.get_running_loop().time() + wait
    while ch.ended is None and lid in broker.sched.ledger.leases:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            break
        async with ch.changed:
            try:
                await asyncio.wait_for(ch.changed.wait(), left)
            except TimeoutError:
                break
    ended = lid not in broker.sched.ledger.leases
    log.info("lease %s released by its run (%s)%s", lid, body.reason,
             "" if ended else "; memory not yet confirmed free")
    return web.json_response({"id": lid, "ended": ended, "reason": ch.ended})


async def get_lease(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    lid = request.match_info["id"]
    _lease(broker, lid)
    for le in broker.status()["leases"]:
        if le["id"] == lid:
            return web.json_response(le)
    raise KeyError(f"lease {lid!r}: not known")


async def operator(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    op = request.match_info["op"]
    if op not in ("park", "wake", "drain", "hold", "release-hold"):
        raise web.HTTPNotFound(reason=f"operator action {op!r}: expected park, wake, drain, "
                                      f"hold or release-hold")
    body: OperatorBody = await parse_body(request, OperatorBody)
    peer = peer_of(request)
    if not is_operator(broker.cfg, peer):
        log.warning("operator %s by uid %s refused", op, peer[1])
        return error(403, f"operator action {op!r} refused: uid {peer[1]} is not an operator "
                          f"(root, berthd's user, or a member of [api] operator_group)",
                     "forbidden")
    who = f"pid {peer[0]} uid {peer[1]}" if peer else f"{request.remote} with the TCP key"
    woken = wake_drained(broker, body.target) if op == "wake" else None
    if woken is not None:           # a drained run: it asks for its card again (issue 35)
        log.info("operator wake %s (drained) by %s: %s", body.target, who, woken["notes"][0])
        return web.json_response(woken)
    lease = find_target(broker, body.target, op)
    fx = await broker.submit(lambda now: broker.sched.operator(op, lease.id, now))
    # every operator action is logged with who did it (issue 15)
    log.info("operator %s %s by %s%s", op, lease.engine, who,
             ", overriding its hold" if any(getattr(e, "kind", "") == "hold.override"
                                            for e in fx) else "")
    return web.json_response({"lease": lease.id, "engine": lease.engine, "op": op,
                              "notes": [e.text for e in fx if hasattr(e, "text")]})


async def status(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    st = broker.status()
    aliases, callers = request.app[ALIASES], request.app[CALLERS]
    # The gateway routes only to a lease that passes these (issue 26: names are owned).
    leases = list(broker.sched.ledger.leases.values())
    verdicts = owners.checked(broker.cfg, leases, aliases, callers)
    for le in st["leases"]:
        le["aliases"] = aliases.get(le["id"], [])
        le["owner_checked"], le["front_checked"] = verdicts.get(le["id"], (False, False))
    # A drained run's front takes its engine's requests (issue 35), by the same rules.
    first = owners.first_holders(broker.cfg, leases, aliases, callers) if st.get("drained") \
        else {}
    for row in st.get("drained", []):
        run = broker.drained.runs.get(row["engine"])
        row["owner_checked"], row["front_checked"] = (False, False) if run is None else \
            owners.drained_checked(broker.cfg, run, first)
    live = {le["id"] for le in st["leases"]}
    for table in (aliases, callers):
        for lid in [k for k in table if k not in live]:
            del table[lid]
    st["switch_costs"] = request.app[BROKER].costs.as_json()
    return web.json_response(st)


async def timeline(request: web.Request) -> web.Response:
    broker = request.app[BROKER]
    after = int(query_number(request, "after", 0, 0, 2**62))
    timeout = query_number(request, "timeout", 0.0, 0.0, 600.0)
    entries = await broker.wait_timeline(after, timeout) if timeout else \
        [x for x in broker.timeline if x["seq"] > after]
    return web.json_response({"entries": entries})


async def note(request: web.Request) -> web.Response:
    """``POST /v1/notes {"engine", "text"}``: a host's word about an engine it manages that no
    lease carries; ``berth status`` shows the newest per engine (issue 37)."""
    broker = request.app[BROKER]
    body: NoteBody = await parse_body(request, NoteBody)
    peer = peer_of(request)
    by = f"pid {peer[0]}" if peer is not None else "a client"
    now = broker.clock()
    broker.host_notes.add(body.engine, body.text, by, broker.timeline, now - broker.started_at, now)
    log.warning("host note on %s (%s): %s", body.engine, by, body.text)
    return web.json_response({"engine": body.engine})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "pid": os.getpid()})


def make_app(broker: Broker, key: str | None = None, waits=None) -> web.Application:
    app = web.Application(middlewares=[errors, auth(key), known_query], client_max_size=1 << 20)
    app[BROKER] = broker
    # A body still arriving is bounded like a silent one on the listeners (issue 36's limits)
    app[BODY_WAIT_S] = float(broker.cfg.listeners.idle_timeout)
    app[SCRAPE] = Scrape(broker, waits)
    app[ALIASES] = {}
    app[CALLERS] = {}
    r = app.router
    r.add_post("/v1/leases", request_lease)
    r.add_get("/v1/leases/{id}", get_lease)
    r.add_get("/v1/leases/{id}/grant", wait_grant)
    r.add_post("/v1/leases/{id}/attach", attach)
    r.add_post("/v1/leases/{id}/report", report)
    r.add_get("/v1/leases/{id}/instructions", instructions)
    r.add_post("/v1/leases/{id}/wake", wake)
    r.add_delete("/v1/leases/{id}/wake", unwake)
    add_extend_routes(app, broker, _lease)       # POST and DELETE .../extend
    # Runs whose engine was drained (issue 35): the board lists them (status.board).
    broker.drained = getattr(broker, "drained", None) or DrainedRuns()
    add_drained_routes(app, broker.drained, broker.cfg)    # PUT and DELETE /v1/drained/{engine}
    r.add_post("/v1/leases/{id}/touch", touch)
    r.add_post("/v1/leases/{id}/jobs", jobs)
    r.add_post("/v1/leases/{id}/ready", ready)
    r.add_post("/v1/leases/{id}/release", release)
    r.add_post("/v1/operator/{op}", operator)
    r.add_get("/v1/status", status)
    r.add_get("/v1/timeline", timeline)
    r.add_post("/v1/notes", note)
    r.add_get("/v1/health", health)
    r.add_get("/metrics", metrics)
    return app

