"""Who may claim a process or end a lease: the peer's credentials (``SO_PEERCRED``) on the Unix
socket, the bearer key on TCP, and the host plugins' vouching (``berth_vouch``).

Source: issue 4 "The control API" (attach rules), issue 7 (adopting a process a host started).
An attach is allowed only if the caller is that process, or its parent, or a host plugin vouches
for it; any other attach is refused (403) and logged.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd

import psutil
from aiohttp import web
from berth.daemon.api_bodies import error
from berth.daemon.broker import Broker
from berth.decide.model import Lease
from berth.process import ProcessId, identify, peer_credentials

__all__ = ["auth", "caller_of_request", "claim", "groups_of", "is_operator",
           "is_self_or_descendant", "may_act", "may_release", "may_report", "peer_of",
           "priority_cap"]

log = logging.getLogger("berth.daemon.api")


def auth(key: str | None):
    """Middleware: on TCP (no peer credentials) a request needs ``Authorization: Bearer <key>``
    when berthd has a key; otherwise 401. The Unix socket relies on its file mode (0660)."""
    @web.middleware
    async def check(request: web.Request, handler):
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if key and peer_credentials(sock) is None:       # TCP: the key is required
            if request.headers.get("Authorization") != f"Bearer {key}":
                return error(401, "the TCP control API needs 'Authorization: Bearer <key>'",
                             "unauthorized")
        return await handler(request)
    return check


def peer_of(request: web.Request) -> tuple[int, int, int] | None:
    """The caller's ``(pid, uid, gid)`` on the Unix socket; ``None`` on TCP."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    return peer_credentials(sock)


def caller_of_request(request: web.Request) -> tuple[int | None, int, int]:
    """The caller's ``(pid, uid, gid)``; a TCP caller (with the key: an operator) counts as
    berthd's own user."""
    return peer_of(request) or (None, os.geteuid(), os.getegid())


async def claim(broker: Broker, request: web.Request, pid: int, start_time: float | None,
                engine: str, host: str | None) -> tuple[ProcessId, web.Response | None, str]:
    """May the caller claim process ``pid`` for ``engine``? Returns ``(identity, refusal,
    why)``: ``refusal`` is a 403 answer, or ``None`` when allowed because the caller is the
    process, or its parent, or a host plugin vouches (``berth_vouch``). Raises 400 for a PID
    that is not alive or whose start time (seconds since the epoch) differs."""
    actual = identify(pid)
    if actual is None:
        raise web.HTTPBadRequest(reason=f"pid: no live process {pid}")
    if start_time is not None and abs(actual.start_time - start_time) > 0.05:
        raise web.HTTPBadRequest(reason=f"start_time: pid {pid} started at "
                                        f"{actual.start_time}, not {start_time}")
    peer = peer_of(request)
    allowed, why = False, "no peer credentials (TCP) and no plugin vouches"
    if peer is not None:
        ppid = _ppid(pid)
        if peer[0] == pid:
            allowed, why = True, "the caller is the process"
        elif ppid == peer[0]:
            allowed, why = True, "the caller is its parent"
        else:
            why = f"caller pid {peer[0]} is neither pid {pid} nor its parent ({ppid})"
    if not allowed and broker.pm is not None:
        # A plugin may ask its host (supervisord's XML-RPC, up to about a second): off the loop.
        verdict = await asyncio.to_thread(broker.pm.hook.berth_vouch, pid=pid,
                                          start_time=actual.start_time, engine=engine, host=host)
        if verdict:
            allowed, why = True, f"vouched for by the {host or 'host'} plugin"
        elif host:
            why += f"; the {host} plugin does not vouch for it"
    if not allowed:
        log.warning("claim of pid %s for %s refused: %s", pid, engine, why)
        return actual, error(403, f"attach refused: {why}", "forbidden"), why
    return actual, None, why


def is_self_or_descendant(pid: int, ancestor: int) -> bool:
    """True if ``pid`` is ``ancestor`` or one of its descendants."""
    if pid == ancestor:
        return True
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def _ppid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def may_release(lease: Lease, caller: int) -> bool:
    """The lease's owner (the run that asked for it), its engine, or an ancestor of either may
    release it; nobody else."""
    for pid in (lease.owner_pid, lease.pid):
        if pid is not None and is_self_or_descendant(pid, caller):
            return True
    return lease.owner_pid is None and lease.pid is None



def _uid_of(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def may_report(lease: Lease, peer: tuple[int, int, int] | None) -> tuple[bool, str]:
    """May this caller attach a process to ``lease`` or report on it (issue 18, hole 2)? On TCP
    (``peer`` is ``None``) the key already vouched. On the Unix socket: root, and any process of
    the Unix user that owns the lease (the user of its owner process, else of its engine; a
    process of one user can already signal any other of that user, so no finer line holds).
    A lease whose processes are both gone answers only root and berthd's own user. Returns
    ``(allowed, why)``."""
    if peer is None or peer[1] == 0:
        return True, "root or the TCP key"
    owner = _uid_of(lease.owner_pid)
    if owner is None:
        owner = _uid_of(lease.pid)
    if owner is None:
        owner = os.geteuid()
    if peer[1] == owner:
        return True, f"uid {peer[1]} owns the lease"
    return False, f"caller uid {peer[1]} (pid {peer[0]}) does not own lease {lease.id} (uid {owner})"


def groups_of(pid: int, gid: int) -> set[int]:
    """The caller's primary and supplementary groups (``/proc/PID/status``)."""
    out = {gid}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    out |= {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return out


def is_operator(cfg, peer: tuple[int, int, int] | None) -> bool:
    """Is the caller an operator (issue 18, hole 4)? Root, the socket's owner (berthd's own
    user: berthd creates the socket), a member of ``[api] operator_group``, or a TCP caller
    with the key (``peer`` is ``None``)."""
    if peer is None or peer[1] in (0, os.geteuid()):
        return True
    group = getattr(getattr(cfg, "api", None), "operator_group", None)
    if not group:
        return False
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning("[api] operator_group %r: no such group", group)
        return False
    return gid in groups_of(peer[0], peer[2])


def may_act(cfg, lease: Lease, peer: tuple[int, int, int] | None) -> tuple[bool, str]:
    """May this caller use a lease verb on ``lease`` (wake and its withdrawal, touch, ready,
    extend, jobs, report, attach)? Its owner (:func:`may_report`) or an operator
    (:func:`is_operator`); issue 26. Returns ``(allowed, why)``."""
    ok, why = may_report(lease, peer)
    if ok:
        return True, why
    if is_operator(cfg, peer):
        return True, f"uid {peer[1]} is an operator"
    return False, why


def priority_cap(cfg, engine: str, peer: tuple[int, int, int] | None) -> int | None:
    """The highest priority this caller may ask for ``engine``: ``None`` (no cap) for an
    operator, else the larger of the engine entry's ``max_priority`` (default: its
    ``priority``; 0 without an entry) and ``[api] max_priority`` for the caller's user name
    (default 0)."""
    if is_operator(cfg, peer):
        return None
    entry = cfg.engines.get(engine)
    by_engine = 0 if entry is None else (entry.max_priority if entry.max_priority is not None
                                         else entry.priority)
    try:
        user = pwd.getpwuid(peer[1]).pw_name
    except KeyError:
        user = str(peer[1])
    return max(by_engine, cfg.api.max_priority.get(user, 0))
