"""The state file: every lease, share and waiter, so state survives the daemon (rule 5).

Source: seed 002 rule 5; issue 4 "State that survives". TOML written with tomli-w, atomically
(:func:`berth.paths.write_atomic`, Berth's one way: a temporary file in the same directory,
fsync, rename over the old one, fsync of the directory). Times are the broker's monotonic
clock (seconds since boot, shared by every process), so they stay meaningful across a daemon
restart within one boot; ``boot_id`` tells a reboot apart, after which no lease can be alive.

:func:`load` returns ``None`` for a missing file and raises :class:`StateCorrupt` for one that
cannot be read; :func:`quarantine` moves such a file aside. A lease entry that cannot be used (a
wrong type, a size below 0 bytes: issue 26) is refused alone, with a message naming the entry,
the field and the value (:attr:`Snapshot.refused`); the rest of the state is kept.
"""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w
from berth.decide.admission import WaitKind
from berth.decide.model import (
    DEFAULT_KEEP_WARM_S,
    Bound,
    Capabilities,
    Lease,
    ParkMechanism,
    Share,
    ShareState,
)
from berth.paths import write_atomic

__all__ = ["Snapshot", "StateCorrupt", "dump", "load", "write_atomic", "quarantine", "boot_id"]

VERSION = 1


class StateCorrupt(ValueError):
    """The state file exists but cannot be used (truncated, not TOML, wrong shape)."""


@dataclass
class Snapshot:
    """What the state file holds: leases, waiting entries ``(lease_id, kind, since)``, counters,
    per-card baselines (bytes), and the boot it was written in. ``refused``: one message per
    lease entry left out (read only)."""

    leases: list[Lease] = field(default_factory=list)
    waiting: list[tuple[str, str, float]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    baselines: dict[str, int] = field(default_factory=dict)
    boot_id: str = ""
    refused: list[str] = field(default_factory=list)


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), or ``""`` where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _clean(d: dict) -> dict:
    """TOML has no null: drop ``None`` values (recursively)."""
    out = {}
    for k, v in d.items():
        if v is None:
            continue
        out[k] = _clean(v) if isinstance(v, dict) else v
    return out


def _share_dict(sh: Share) -> dict:
    return _clean({"card": sh.card, "size_bytes": sh.size_bytes, "whole_card": sh.whole_card,
                   "state": sh.state.value, "reserved_bytes": sh.reserved_bytes,
                   "used_bytes": sh.used_bytes, "lent_bytes": sh.lent_bytes,
                   "residual_bytes": sh.residual_bytes, "parked_bytes": sh.parked_bytes,
                   "lent_to": sh.lent_to,
                   "borrowed_from": sh.borrowed_from, "since": sh.since})


def _lease_dict(le: Lease) -> dict:
    return _clean({
        "id": le.id, "engine": le.engine, "priority": le.priority, "bound": le.bound.value,
        "growth_allowance_bytes": le.growth_allowance_bytes, "need_bytes": dict(le.need_bytes),
        "keep_warm_s": le.keep_warm_s,
        "caps": _clean(le.caps.as_dict()), "pid": le.pid, "start_time": le.start_time,
        "owner_pid": le.owner_pid, "owner_start_time": le.owner_start_time,
        "reaper": le.reaper or None,
        "requested_at": le.requested_at, "granted_at": le.granted_at, "ready_at": le.ready_at,
        "resumed_at": le.resumed_at,
        "last_used_at": le.last_used_at, "held": le.held,
        "restart_grace_s": le.restart_grace_s, "restarting_until": le.restarting_until,
        "max_job_s": le.max_job_s, "may_preempt": le.may_preempt,
        "frees_nothing": le.frees_nothing, "movable": sorted(le.movable),
        "makes_room": le.makes_room,
        # What was measured of it: without them a restarted berthd would give a holder a
        # turn and a rent of 0 s (it yields at once) and read its front's next count of
        # requests served as a new request.
        "served": le.served, "switch_cost_s": le.switch_cost_s,
        "park_cost_s": le.park_cost_s, "last_job_at": le.last_job_at,
        "shares": [_share_dict(sh) for sh in le.shares.values()],
    })


def dump(snap: Snapshot) -> bytes:
    """Serialise a snapshot to TOML bytes."""
    doc = {"version": VERSION, "boot_id": snap.boot_id, "written_at": time.time(),
           "counters": dict(snap.counters), "baselines": dict(snap.baselines),
           "leases": [_lease_dict(le) for le in snap.leases],
           "waiting": [{"lease_id": lid, "kind": kind, "since": since}
                       for lid, kind, since in snap.waiting]}
    return tomli_w.dumps(doc).encode()


def _bytes(d: dict, where: str, name: str, default: int | None = 0) -> int | None:
    """Field ``name`` of ``d``: a whole number of bytes, 0 or more (``default`` if absent).
    Raises ValueError naming ``where.name`` and the value."""
    v = d.get(name, default)
    if v is None and default is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}.{name}: expected 0 or more bytes, got {v!r:.40}")
    return v


def _share_from(d: dict, where: str = "leases.shares") -> Share:
    _typed(d, where, card=str, lent_to=str, borrowed_from=str, used_bytes=int)
    if not isinstance(d["card"], str):
        raise TypeError(f"{where}.card: expected a string, got {d['card']!r:.40}")
    if "size_bytes" not in d:
        raise KeyError(f"{where}.size_bytes")
    return Share(card=d["card"], size_bytes=_bytes(d, where, "size_bytes"),
                 state=ShareState(d["state"]), whole_card=bool(d.get("whole_card", False)),
                 reserved_bytes=_bytes(d, where, "reserved_bytes"),
                 used_bytes=_bytes(d, where, "used_bytes", None),
                 lent_bytes=_bytes(d, where, "lent_bytes"),
                 residual_bytes=_bytes(d, where, "residual_bytes"),
                 parked_bytes=_bytes(d, where, "parked_bytes"), lent_to=d.get("lent_to"),
                 borrowed_from=d.get("borrowed_from"), since=float(d.get("since", 0.0)))


def _typed(d: dict, where: str, **kinds) -> None:
    """Raise TypeError unless each named field present in ``d`` has its type (None allowed)."""
    for name, kind in kinds.items():
        v = d.get(name)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool) and kind is not bool):
            raise TypeError(f"{where}.{name}: expected {kind}, got {v!r:.80}")


def _lease_from(d: dict) -> Lease:
    _typed(d, "leases", id=str, engine=str, pid=int, owner_pid=int, start_time=(int, float),
           owner_start_time=(int, float), granted_at=(int, float), ready_at=(int, float),
           need_bytes=dict, served=int, switch_cost_s=(int, float), park_cost_s=(int, float),
           last_job_at=(int, float), reaper=bool)
    if not isinstance(d["id"], str) or not isinstance(d["engine"], str):
        raise TypeError(f"leases: id and engine must be strings, got {d['id']!r:.40}, "
                        f"{d['engine']!r:.40}")
    caps = d.get("caps", {})
    if not isinstance(d["shares"], list) or not all(isinstance(s, dict) for s in d["shares"]):
        raise TypeError(f"leases.shares: expected an array of tables, got {d['shares']!r:.80}")
    if not isinstance(caps, dict):
        raise TypeError(f"leases.caps: expected a table, got {caps!r:.80}")
    shares = [_share_from(s, f"shares[{i}]") for i, s in enumerate(d["shares"])]
    need = d.get("need_bytes", {})
    movable = d.get("movable", [])
    if not isinstance(movable, list) or not all(isinstance(p, str) for p in movable):
        raise TypeError(f"leases.movable: expected an array of PCI addresses, got "
                        f"{movable!r:.80}")
    return Lease(
        id=d["id"], engine=d["engine"], shares={s.card: s for s in shares},
        priority=int(d.get("priority", 0)), bound=Bound(d.get("bound", "declared")),
        growth_allowance_bytes=_bytes(d, "lease", "growth_allowance_bytes"),
        keep_warm_s=float(d.get("keep_warm_s", DEFAULT_KEEP_WARM_S)),
        need_bytes={k: _bytes(need, "need_bytes", k) for k in need},
        caps=Capabilities(park=ParkMechanism(caps["park"]) if caps.get("park") else None,
                          lend=bool(caps.get("lend", False)),
                          lend_max_bytes=caps.get("lend_max_bytes"), front=caps.get("front"),
                          drain=bool(caps.get("drain", True)), no_park=caps.get("no_park"),
                          pinned=caps.get("pinned"),
                          restore_across=bool(caps.get("restore_across"))),
        pid=d.get("pid"), start_time=d.get("start_time"), owner_pid=d.get("owner_pid"),
        owner_start_time=d.get("owner_start_time"), reaper=d.get("reaper", False),
        requested_at=float(d.get("requested_at", 0)),
        granted_at=d.get("granted_at"), ready_at=d.get("ready_at"),
        resumed_at=float(d.get("resumed_at", 0.0)),
        last_used_at=float(d.get("last_used_at", 0)),
        held=bool(d.get("held", False)),
        restart_grace_s=float(d.get("restart_grace_s", 0.0)),
        restarting_until=d.get("restarting_until"),
        max_job_s=float(d["max_job_s"]) if d.get("max_job_s") is not None else None,
        may_preempt=bool(d.get("may_preempt", False)),
        frees_nothing=d.get("frees_nothing"), makes_room=d.get("makes_room", True) is not False,
        movable=frozenset(p for p in movable if p in {s.card for s in shares}),
        served=max(0, d.get("served", 0)), switch_cost_s=float(d.get("switch_cost_s", 0.0)),
        park_cost_s=float(d.get("park_cost_s", 0.0)), last_job_at=d.get("last_job_at"))


def load(path: Path) -> Snapshot | None:
    """Read the state file; ``None`` if there is none. Raises :class:`StateCorrupt`."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:            # a directory in its place, no permission, an I/O error
        raise StateCorrupt(f"{path}: cannot read the state file: {type(e).__name__}: "
                           f"{e.strerror or e}") from None
    try:
        doc = tomllib.loads(raw.decode())
        if doc.get("version") != VERSION:
            raise StateCorrupt(f"{path}: state version {doc.get('version')!r}, expected {VERSION}")
        waiting = [(w["lease_id"], WaitKind(w["kind"]).value, float(w["since"]))
                   for w in _tables(doc, "waiting")]
        leases, refused = _leases(_tables(doc, "leases"))
        return Snapshot(leases=leases, waiting=waiting,
                        counters={k: int(v) for k, v in _table(doc, "counters").items()},
                        baselines={k: int(v) for k, v in _table(doc, "baselines").items()},
                        boot_id=str(doc.get("boot_id", "")), refused=refused)
    except StateCorrupt:
        raise
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError,
            AttributeError, RecursionError) as e:
        raise StateCorrupt(f"{path}: cannot read the state file: {type(e).__name__}: {e}") from None


def _leases(entries: list[dict]) -> tuple[list[Lease], list[str]]:
    """The lease entries that can be used, and a message for each one that cannot (issue 26:
    one bad entry costs only itself)."""
    leases, refused = [], []
    for i, d in enumerate(entries):
        try:
            leases.append(_lease_from(d))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            why = f"missing {e.args[0]}" if isinstance(e, KeyError) else str(e)
            name = f" (id {d.get('id')!r:.60}, engine {d.get('engine')!r:.60})"
            refused.append(f"leases[{i}]{name}: {why}")
    return leases, refused


def _table(doc: dict, key: str) -> dict:
    v = doc.get(key, {})
    if not isinstance(v, dict):
        raise TypeError(f"{key}: expected a table, got {v!r:.80}")
    return v


def _tables(doc: dict, key: str) -> list[dict]:
    """An array of tables; each member's own fields are checked where they are read."""
    v = doc.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise TypeError(f"{key}: expected an array of tables, got {v!r:.80}")
    return v


def quarantine(path: Path) -> Path:
    """Move a corrupt state file aside (``state.toml.corrupt-<unix time>``); return the new path."""
    dest = Path(path).with_name(f"{Path(path).name}.corrupt-{int(time.time())}")
    os.replace(path, dest)
    return dest
