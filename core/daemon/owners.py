"""Who may hold an engine's name, and where the gateway may send its requests.

Source: issue 26 "Engine names are owned". The gateway routes a model by name to the front of
the lease that holds it, so a name is a route: whoever holds it receives that model's requests,
prompts included.

1. A name declared in berth.toml (``[engines.NAME]``) may be held only by the Unix users its
   entry names (``users``) and the members of its ``group``; with neither, by the operators
   (``[api] operator_group``). Root and berthd's own user always may (they run the broker).
2. Any other name is owned by the first live lease that holds it (its engine name or one of its
   aliases), until that lease ends; another user's lease for it is refused. Operators may.
3. A front must be on this machine (loopback, an unspecified address, or one of this machine's
   own addresses) or on a configured peer's host (``[network] peers``); the front an engine's
   entry names in berth.toml is the operator's and always may.
4. One live run per engine name: a lease whose engine name a live lease of another process
   holds (its owner, else its engine, still the process berthd recorded), or a live drained
   run (issue 35: it asks for its card again), is refused with a 409 naming the name and that
   process; two runs of one name made berthd's log and ``berth status`` ambiguous. The same
   process may ask again (a drained run's new lease, a host's lease per program); a run that
   died leaves its name free at once.

A lease's holder is the caller that asked for it (its peer credentials, remembered by the API
for the daemon's life); for a lease restored from the state file, the Unix user of its owner
process, else of its engine process, else (both gone) berthd's own user, as
:func:`berth.daemon.api_claims.may_report` has it. :func:`checked` runs the same rules over
every lease for berthd's status, so a restored lease, or one written by an older berthd, is
checked too; the gateway routes only to a lease whose ``owner_checked`` and ``front_checked``
are true.
"""

from __future__ import annotations

import grp
import ipaddress
import logging
import os
import pwd
import socket
from typing import Iterable
from urllib.parse import urlsplit

import psutil
from aiohttp import web
from berth.config import Config
from berth.daemon.api_bodies import error
from berth.daemon.api_claims import caller_of_request, groups_of, is_operator
from berth.decide.model import Lease

__all__ = ["Caller", "caller_of", "name_refusal", "front_refusal", "first_holders", "checked",
           "drained_checked", "names_refused", "second_run"]

log = logging.getLogger("berth.daemon.api")

#: ``(pid, uid, gid)`` of a caller; ``pid`` is ``None`` when the process is gone.
Caller = tuple[int | None, int, int]


def caller_of(lease: Lease) -> Caller:
    """The lease's holder: its owner process, else its engine process (each only while it is
    the process recorded: same start time), else berthd's own user."""
    for pid, start in ((lease.owner_pid, lease.owner_start_time), (lease.pid, lease.start_time)):
        if pid is None:
            continue
        try:
            p = psutil.Process(pid)
            if start is not None and abs(p.create_time() - start) > 0.05:
                continue
            return pid, p.uids().real, p.gids().real
        except psutil.Error:
            continue
    return None, os.geteuid(), os.getegid()


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _in_group(group: str, caller: Caller) -> bool:
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    return gid in (groups_of(caller[0], caller[2]) if caller[0] else {caller[2]})


def _operator(cfg: Config, caller: Caller) -> bool:
    if caller[1] in (0, os.geteuid()):
        return True
    if caller[0] is None:
        group = cfg.api.operator_group
        return bool(group) and _in_group(group, caller)
    return is_operator(cfg, caller)


def _declared_refusal(cfg: Config, name: str, caller: Caller) -> str | None:
    """Rule 1 for the declared name ``name``: ``None`` when ``caller`` may hold it, else why."""
    entry = cfg.engines[name]
    uid = caller[1]
    if uid in (0, os.geteuid()):
        return None
    if entry.users or entry.group:
        if _user(uid) in entry.users or (entry.group and _in_group(entry.group, caller)):
            return None
        named = ([f"users {', '.join(entry.users)}"] if entry.users else []) + \
            ([f"members of group {entry.group}"] if entry.group else [])
        who = " and ".join(named)
    else:
        if _operator(cfg, caller):
            return None
        who = "the operators (root, berthd's user, [api] operator_group)"
    return (f"engine name {name!r} is declared in berth.toml ([engines.{name}]) and may be "
            f"leased only by {who}; uid {uid} ({_user(uid)}) is not one of them (set "
            f"[engines.{name}] users or group, or use another name)")


def first_holders(cfg: Config, leases: list[Lease], aliases: dict[str, list[str]],
                  callers: dict[str, Caller]) -> dict[str, int]:
    """Undeclared name -> uid of the first lease (in berthd's order, oldest first) that holds
    it, as its engine name or an alias, and passed rules 1 and 2. ``callers``: lease id -> who
    asked for it (the others: :func:`caller_of`)."""
    return _walk(cfg, leases, aliases, callers)[1]


def name_refusal(cfg: Config, names: Iterable[str], caller: Caller,
                 first: dict[str, int]) -> str | None:
    """Rules 1 and 2 for a lease that would hold ``names`` (its engine name and aliases), asked
    by ``caller``; ``first`` is :func:`first_holders` over the other leases. ``None`` when it
    may, else why not (for a 403)."""
    for name in names:
        if name in cfg.engines:
            why = _declared_refusal(cfg, name, caller)
            if why:
                return why
            continue
        holder = first.get(name)
        if holder is not None and holder != caller[1] and not _operator(cfg, caller):
            return (f"engine name {name!r} is held by a lease of uid {holder} "
                    f"({_user(holder)}) until it ends; uid {caller[1]} ({_user(caller[1])}) "
                    f"may not take it (use another name)")
    return None


def _hosts(front: str) -> list[str]:
    """The hosts a front names: each ``http(s)://`` URL's and each ``HOST:PORT`` word's."""
    out = []
    for word in front.replace(";", " ").split():
        if "://" in word:
            try:
                host = urlsplit(word).hostname
            except ValueError:
                host = word
            out.append(host or "")
            continue
        host, sep, port = word.rpartition(":")
        if sep and port.isdigit():
            out.append(host.strip("[]") or "127.0.0.1")
    return out


def _own_addresses() -> set[str]:
    out = {"localhost"}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(a.address.split("%")[0])
    return out


def _local(host: str, own: set[str]) -> bool:
    if host.lower() in own:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified or str(ip) in own


def front_refusal(cfg: Config, engine: str, front: str | None) -> str | None:
    """Rule 3: ``None`` when the gateway may send ``engine``'s requests to ``front``, else why
    not (for a 403)."""
    if not front:
        return None
    entry = cfg.engines.get(engine)
    if entry is not None and front in (entry.front, entry.url):
        return None
    peers = {urlsplit(p).hostname for p in cfg.network.peers}
    own = _own_addresses()
    for host in _hosts(front):
        if not (_local(host, own) or host in peers):
            return (f"front: {host!r} is neither this machine nor a peer of [network] peers; "
                    f"a front must listen here (127.0.0.1:PORT), so that the gateway sends "
                    f"no model's requests elsewhere")
    return None


def checked(cfg: Config, leases: list[Lease], aliases: dict[str, list[str]],
            callers: dict[str, Caller]) -> dict[str, tuple[bool, bool]]:
    """Lease id -> ``(owner_checked, front_checked)``: rules 1 and 2 for its names (a later
    lease of another user holding an undeclared name fails), rule 3 for its front.
    ``callers``: lease id -> who asked for it (the others: :func:`caller_of`)."""
    return _walk(cfg, leases, aliases, callers)[0]


def _walk(cfg: Config, leases: list[Lease], aliases: dict[str, list[str]],
          callers: dict[str, Caller]) -> tuple[dict[str, tuple[bool, bool]], dict[str, int]]:
    first: dict[str, int] = {}
    out = {}
    for lease in leases:
        names = [lease.engine, *aliases.get(lease.id, [])]
        caller = callers.get(lease.id) or caller_of(lease)
        owner_ok = name_refusal(cfg, names, caller, first) is None
        if owner_ok:
            for name in names:
                if name not in cfg.engines:
                    first.setdefault(name, caller[1])
        out[lease.id] = (owner_ok, front_refusal(cfg, lease.engine, lease.caps.front) is None)
    return out, first


def drained_checked(cfg: Config, run, first: dict[str, int]) -> tuple[bool, bool]:
    """``(owner_checked, front_checked)`` of a drained run (a
    :class:`~berth.daemon.drained.DrainedRun`, issue 35), by the rules a lease's are: its
    engine name and aliases held by whoever told berthd (rules 1 and 2, ``first``:
    :func:`first_holders` over the live leases), its front on this machine (rule 3). The
    gateway sends the drained engine's requests to that front only when both hold."""
    caller = run.caller or (None, os.geteuid(), os.getegid())
    owner_ok = name_refusal(cfg, [run.engine, *run.aliases], caller, first) is None
    return owner_ok, front_refusal(cfg, run.engine, run.front) is None


def names_refused(broker, request: web.Request, engine: str, names: list[str],
                  front: str | None, aliases: dict, callers: dict) -> web.Response | None:
    """The API's check of a lease request (``broker``: the :class:`~berth.daemon.broker.Broker`):
    a 403 unless the caller may hold ``names`` (the lease's engine name and aliases) and the
    gateway may send ``engine``'s requests to ``front``. ``aliases``/``callers``: the API's
    lease id -> aliases and -> who asked."""
    caller = caller_of_request(request)
    first = first_holders(broker.cfg, list(broker.sched.ledger.leases.values()), aliases,
                          callers)
    why = name_refusal(broker.cfg, names, caller, first) or front_refusal(broker.cfg, engine, front)
    if why is None:
        return None
    log.warning("lease for %s by uid %s refused: %s", engine, caller[1], why)
    return error(403, f"lease refused: {why}", "forbidden")


def second_run(broker, engine: str, owner_pid: int | None) -> web.Response | None:
    """Rule 4: a 409 when a live process other than ``owner_pid`` (the asking run) holds a
    lease of ``engine`` or is its drained run, else ``None``. A lease whose run (its owner)
    has died holds no name, whatever its engine still does. The message starts with the
    field (``engine: ...``), as ``berth run`` says it in its flags (``--engine ...``)."""
    from berth.process import ProcessId, alive
    for le in broker.sched.ledger.leases.values():
        if le.engine != engine or owner_pid is not None and le.owner_pid == owner_pid:
            continue
        if le.owner_pid is not None and le.owner_start_time is not None and not alive(
                ProcessId(le.owner_pid, le.owner_start_time)):
            # Its run died: the name is free at once, not at berthd's next read (up to
            # read_interval later, when the lease goes). Its engine, which the run's watchdog
            # is stopping, was named as the holder: a run restarted at once was refused.
            continue
        pid = caller_of(le)[0]
        if pid is not None and pid != owner_pid:
            return _second(engine, pid, f"lease {le.id}")
    run = getattr(broker, "drained", None) and broker.drained.runs.get(engine)
    if run and run.owner is not None and run.owner.pid != owner_pid:
        if alive(run.owner):
            return _second(engine, run.owner.pid, "its drained run, which waits to start it "
                                                  "again")
    return None


def _second(engine: str, pid: int, what: str) -> web.Response:
    why = (f"engine: {engine!r} is already run by pid {pid} ({what}); one live run per engine "
           f"name, so berthd's log and `berth status` name one run: stop pid {pid} first, or "
           f"give this run another --engine name")
    log.warning("lease for %s refused: %s", engine, why)
    return error(409, why, "conflict", holder_pid=pid)
