"""Simulated cards shared between processes: the store behind ``berth.sim.driver``.

Source: issue 3 "simulated cards"; seed 002 rule 1 ("the driver decides") and
reference/park-mechanisms.md ("After exit", "cuda-checkpoint") for the behaviour it imitates.

One directory (default :func:`berth.paths.sim_dir`) holds ``cards.json``, the whole state, and
``cards.lock``, an ``fcntl.flock`` lock every writer takes. Writes are atomic (temp file, fsync,
``os.replace``; :mod:`berth.sim.store`), so a reader that only needs a consistent snapshot may
read without the lock (:meth:`SimCards.state_of`, which a stub engine polls on every step).

The state, in bytes and seconds:

- cards: ``pci``, ``name``, ``uuid``, ``total_bytes``, ``baseline_bytes`` (always counted as used)
  and a persistent ``oom_events`` counter;
- processes, keyed by (PID, start time from ``psutil``): a checkpoint ``state``
  (``running`` / ``locked`` / ``checkpointed``), ``card`` bytes per PCI (on the card) and ``host``
  bytes per PCI (moved out by a checkpoint, not counted on the card).

A card's free bytes are ``total − baseline − Σ card bytes of every process still counted``.

Exit and the free delay: a process's memory is freed only after it has exited (PID gone, a zombie,
or a different start time) **and** ``free_delay_s`` has passed, like a real driver that frees
asynchronously to the kill (0.5–1.5 s, reference "After exit"). Every locked pass over the state
(each read, alloc and checkpoint action) runs a GC step that records the first time any reader saw
the process gone; the delay counts from that first read, and the memory is freed by the first pass
at or after ``seen_gone + free_delay_s``. Times are ``time.monotonic()``, which is one clock for
every process on a Linux host (``CLOCK_MONOTONIC``).

``$BERTH_SIM_REGISTRY``, when set, names a file to which every declaration (:meth:`SimCards.init`,
in any process) appends its directory, one absolute path a line: the test suite reads every
simulated card's OOM counter through it (tests/conftest.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from berth import paths
from berth.decide.pci import normalize_pci
from berth.decide.units import format_size
from berth.driver.cuda import INVALID_VALUE, NOT_SUPPORTED

from . import store
from .store import _VERSION, SimError
from .store import start_time as _start_time

__all__ = ["CardSpec", "CardState", "ProcState", "Snapshot", "SimCards", "SimError", "SimOOM",
           "SimBusy", "sim_uuid", "RUNNING", "LOCKED", "CHECKPOINTED"]


#: Checkpoint states of a process (``CUprocessState`` RUNNING 0, LOCKED 1, CHECKPOINTED 2; the
#: simulation has no uncorrectable errors, so it never enters FAILED 3).
RUNNING, LOCKED, CHECKPOINTED = "running", "locked", "checkpointed"

_GIB = float(1 << 30)


class SimOOM(MemoryError):
    """An allocation or a restore did not fit on a simulated card; the message reads like CUDA's.
    Bytes: ``requested_bytes``, ``total_bytes``, ``used_bytes``, ``free_bytes``."""

    cuda_error = 2   # CUDA_ERROR_OUT_OF_MEMORY

    def __init__(self, pci: str, index: int, name: str, requested_bytes: int, total_bytes: int,
                 used_bytes: int, free_bytes: int):
        super().__init__(
            f"CUDA out of memory. Tried to allocate {requested_bytes / _GIB:.2f} GiB (GPU {index}; "
            f"{total_bytes / _GIB:.2f} GiB total capacity; {used_bytes / _GIB:.2f} GiB already "
            f"allocated; {max(free_bytes, 0) / _GIB:.2f} GiB free; simulated card {name} at {pci})")
        self.pci, self.index, self.name = pci, index, name
        self.requested_bytes, self.total_bytes = requested_bytes, total_bytes
        self.used_bytes, self.free_bytes = used_bytes, free_bytes


class SimBusy(RuntimeError):
    """The process is locked or checkpointed: its CUDA calls block until it runs again."""


#: A simulated card's kind unless its declaration names one.
DEFAULT_MODEL = "Berth simulated card"


def sim_uuid(pci: str) -> str:
    """A deterministic CUDA-looking UUID for a simulated card: ``GPU-5e1a0000-0000-0000-0000-`` and
    the PCI address's hex digits (domain, bus, device, function) padded to 12."""
    dom, bus, rest = normalize_pci(pci).split(":")
    dev, fn = rest.split(".")
    return "GPU-5e1a0000-0000-0000-0000-" + f"{dom}{bus}{dev}{fn}".zfill(12)


@dataclass(frozen=True)
class CardSpec:
    """A declared simulated card. ``pci`` normalised; sizes in bytes."""

    pci: str
    name: str
    uuid: str
    total_bytes: int
    baseline_bytes: int = 0
    #: The chip's kind (the product name NVML gives): cuda-checkpoint restores a process onto
    #: another card only of the same kind (issue 35).
    model: str = DEFAULT_MODEL

    @classmethod
    def make(cls, name: str, total_bytes: int, pci: str | None = None, baseline_bytes: int = 0,
             uuid: str | None = None, index: int = 0, model: str | None = None) -> "CardSpec":
        """Build and check a spec. ``pci`` defaults to ``0000:<index+1>:00.0``; ``uuid`` to
        :func:`sim_uuid`; ``model`` to :data:`DEFAULT_MODEL`. Raises ``ValueError`` naming the
        field and value."""
        model = DEFAULT_MODEL if model is None else model
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"card {name}: model must name the card's kind, got {model!r}")
        if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
            raise ValueError(f"card name: expected a short name like 'gpu0', got {name!r}")
        pci = normalize_pci(pci if pci is not None else f"0000:{index + 1:02x}:00.0")
        if not isinstance(total_bytes, int) or total_bytes <= 0:
            raise ValueError(f"card {name}: total_bytes must be a positive byte count, got {total_bytes!r}")
        if not isinstance(baseline_bytes, int) or not 0 <= baseline_bytes < total_bytes:
            raise ValueError(f"card {name}: baseline_bytes must be >= 0 and below the total "
                             f"({total_bytes}), got {baseline_bytes!r}")
        uuid = uuid or sim_uuid(pci)
        if not uuid.startswith("GPU-"):
            raise ValueError(f"card {name}: uuid must look like 'GPU-…', got {uuid!r}")
        return cls(pci=pci, name=name, uuid=uuid, total_bytes=total_bytes,
                   baseline_bytes=baseline_bytes, model=model)

    def as_dict(self) -> dict[str, object]:
        return {"pci": self.pci, "name": self.name, "uuid": self.uuid,
                "total_bytes": self.total_bytes, "baseline_bytes": self.baseline_bytes,
                "model": self.model}


@dataclass(frozen=True)
class ProcState:
    """One process known to the store. ``gone_for_s`` is ``None`` while it lives, else the seconds
    since a reader first saw it gone (its memory still counts until ``free_delay_s``)."""

    pid: int
    start_time: float
    state: str
    stuck: bool
    gone_for_s: float | None
    card: dict[str, int]
    host: dict[str, int]


@dataclass(frozen=True)
class CardState:
    """One read of one simulated card. Bytes. ``processes`` maps PID → bytes on the card for every
    process still counted there (checkpointed processes are absent, gone-but-not-freed present)."""

    spec: CardSpec
    index: int
    free_bytes: int
    used_bytes: int
    oom_events: int
    processes: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Everything in the store, read under the lock after a GC pass."""

    cards: list[CardState]
    procs: list[ProcState]
    free_delay_s: float
    restore_bytes_per_s: float


def _key(pid: int, start_time: float) -> str:
    return f"{pid}@{start_time:.2f}"


class SimCards:
    """Handle on the simulated cards in ``directory`` (default :func:`berth.paths.sim_dir`).

    Cheap to create; every method opens the state file afresh, so any number of processes share
    one directory. Raises :class:`SimError` when the directory holds no declared cards, or
    when none is given and the config that names it does not load.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        try:
            self.directory = Path(directory) if directory is not None else paths.client_sim_dir()
        except ValueError as e:             # berth.config.ConfigError
            raise SimError(f"cannot find the simulated cards: {e}") from None

    # ---- declaring -------------------------------------------------------------------------------

    @classmethod
    def init(cls, directory: str | os.PathLike[str] | None, specs: list[CardSpec],
             free_delay_s: float = 0.5, restore_bytes_per_s: float = 7e9,
             replace: bool = False) -> "SimCards":
        """Declare the cards. Idempotent: the same specs keep every allocation and counter (the
        delay and speed are updated). Different specs raise :class:`SimError` unless ``replace``
        and no process holds memory. Raises ``ValueError`` for duplicate names, PCIs or UUIDs, a
        negative delay or a non-positive speed."""
        if not specs:
            raise ValueError("cards: declare at least one simulated card")
        for attr in ("pci", "name", "uuid"):
            seen = [getattr(s, attr) for s in specs]
            dup = {v for v in seen if seen.count(v) > 1}
            if dup:
                raise ValueError(f"cards: {attr} {sorted(dup)[0]!r} is declared twice")
        if not free_delay_s >= 0:
            raise ValueError(f"free_delay_s: must be >= 0 seconds, got {free_delay_s!r}")
        if not restore_bytes_per_s > 0:
            raise ValueError(f"restore_bytes_per_s: must be > 0, got {restore_bytes_per_s!r}")
        self = cls(directory)
        wanted = [s.as_dict() for s in specs]
        with store.transaction(self.directory, create=True) as st:
            if st.data is not None:
                have = [{k: c.get(k, DEFAULT_MODEL if k == "model" else None) for k in wanted[0]}
                        for c in st.data["cards"]]
                if have != wanted:
                    if not replace:
                        raise SimError(
                            f"the simulated cards in {self.directory} were declared differently "
                            f"({_describe(have)}; now {_describe(wanted)}); remove that directory, "
                            f"pick another one, or pass replace=True (`berth sim init --replace`)")
                    if any(sum(p["card"].values()) + sum(p["host"].values())
                           for p in st.data["procs"].values()):
                        raise SimError(f"cannot redeclare the cards in {self.directory}: "
                                       "processes still hold simulated memory there")
                    st.data = None
            if st.data is None:
                st.data = {"version": _VERSION, "cards": [dict(w, oom_events=0) for w in wanted],
                           "procs": {}}
            st.data["free_delay_s"] = float(free_delay_s)
            st.data["restore_bytes_per_s"] = float(restore_bytes_per_s)
            st.dirty = True
        registry = os.environ.get("BERTH_SIM_REGISTRY")
        if registry:    # one short O_APPEND write: lines from many processes stay whole
            with open(registry, "a") as f:
                f.write(f"{self.directory.resolve()}\n")
        return self

    # ---- reading ---------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every card and process, after a GC pass."""
        with store.transaction(self.directory) as st:
            now = time.monotonic()
            cards = [self._card_state(st.data, i) for i in range(len(st.data["cards"]))]
            procs = [ProcState(pid=p["pid"], start_time=p["start_time"], state=p["state"],
                               stuck=p["stuck"],
                               gone_for_s=None if p["gone_seen_at"] is None
                               else now - p["gone_seen_at"],
                               card=dict(p["card"]), host=dict(p["host"]))
                     for p in st.data["procs"].values()]
            return Snapshot(cards, procs, st.data["free_delay_s"], st.data["restore_bytes_per_s"])

    def read(self, pci: str) -> CardState:
        """One card's free bytes and processes, after a GC pass. Raises :class:`SimError` for a
        card that is not declared."""
        with store.transaction(self.directory) as st:
            return self._card_state(st.data, self._index(st.data, pci))

    def resolve(self, key: str) -> CardSpec:
        """The card named by ``key``: a PCI address, a sim name, a UUID, or an index (``"0"``),
        as ``CUDA_VISIBLE_DEVICES`` may give it. Raises :class:`SimError` naming the key."""
        data = store.load(self.directory)
        cards = [CardSpec(**{k: c[k] for k in CardSpec.__dataclass_fields__ if k in c})
                 for c in data["cards"]]
        key = key.strip()
        for c in cards:
            if key in (c.name, c.uuid):
                return c
        if key.isdigit() and int(key) < len(cards):
            return cards[int(key)]
        try:
            pci = normalize_pci(key)
        except ValueError:
            pci = None
        for c in cards:
            if c.pci == pci:
                return c
        raise SimError(f"card: no simulated card {key!r} in {self.directory} (have "
                       f"{', '.join(f'{c.name} {c.pci} {c.uuid}' for c in cards)})")

    def state_of(self, pid: int) -> str | None:
        """The checkpoint state of ``pid`` (``running`` / ``locked`` / ``checkpointed``), or
        ``None`` when it holds no simulated CUDA context. Lock-free: polled on every engine step."""
        start = _start_time(pid)
        if start is None:
            return None
        p = store.load(self.directory)["procs"].get(_key(pid, start))
        return None if p is None else p["state"]

    def bytes_of(self, pid: int) -> int:
        """Bytes ``pid`` holds, on cards and in the host area together."""
        with store.transaction(self.directory) as st:
            p = self._proc(st.data, pid)
            return sum(p["card"].values()) + sum(p["host"].values())

    # ---- allocating ------------------------------------------------------------------------------

    def alloc(self, pci: str, nbytes: int, pid: int | None = None, block: bool = True,
              poll_s: float = 0.01) -> None:
        """Allocate ``nbytes`` on card ``pci`` for ``pid`` (default: this process).

        Raises :class:`SimOOM` beyond the card's free bytes (and counts the card's ``oom_events``),
        :class:`SimError` for an unknown card or process or a negative size. While the process is
        locked or checkpointed the call blocks like a CUDA call (``block``), or raises
        :class:`SimBusy` (``block=False``).
        """
        self._change(pci, nbytes, pid, block, poll_s, sign=+1)

    def free(self, pci: str, nbytes: int, pid: int | None = None, block: bool = True,
             poll_s: float = 0.01) -> None:
        """Give back ``nbytes`` of ``pid``'s memory on ``pci`` at once (like ``cudaFree`` plus an
        emptied cache). Raises :class:`SimError` for more than the process holds there; blocks or
        raises :class:`SimBusy` like :meth:`alloc`."""
        self._change(pci, nbytes, pid, block, poll_s, sign=-1)

    def release(self, pid: int | None = None) -> int:
        """Forget everything ``pid`` (default: this process) holds, on cards and in the host area,
        whatever its checkpoint state: the process is exiting. Returns the bytes released."""
        pid = os.getpid() if pid is None else pid
        start = _start_time(pid)
        with store.transaction(self.directory) as st:
            p = st.data["procs"].pop(_key(pid, start), None) if start is not None else None
            if p is None:
                return 0
            st.dirty = True
            return sum(p["card"].values()) + sum(p["host"].values())

    def _change(self, pci: str, nbytes: int, pid: int | None, block: bool, poll_s: float,
                sign: int) -> None:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise SimError(f"nbytes: expected a byte count >= 0, got {nbytes!r}")
        pid = os.getpid() if pid is None else pid
        start = _start_time(pid)
        if start is None:
            raise SimError(f"pid {pid}: no such process")
        while True:
            with store.transaction(self.directory) as st:
                key = _key(pid, start)
                p = st.data["procs"].get(key)
                # A process restored onto another card (--device-map) allocates there now.
                i = self._index(st.data, (p or {}).get("remap", {}).get(pci, pci))
                card = st.data["cards"][i]
                if p is not None and p["state"] != RUNNING:
                    if not block:
                        raise SimBusy(f"pid {pid} is {p['state']}: its CUDA calls block")
                else:
                    if p is None and sign < 0:
                        raise SimError(f"pid {pid} holds no simulated memory on {card['pci']}, "
                                       f"cannot free {format_size(nbytes)}")
                    if p is None:
                        p = st.data["procs"][key] = {
                            "pid": pid, "start_time": start, "state": RUNNING, "stuck": False,
                            "gone_seen_at": None, "card": {}, "host": {}}
                        st.dirty = True
                    held = p["card"].get(card["pci"], 0)
                    if sign < 0:
                        if nbytes > held:
                            raise SimError(f"nbytes: pid {pid} holds {format_size(held)} on "
                                           f"{card['pci']}, cannot free {format_size(nbytes)}")
                    else:
                        free_bytes = self._free(st.data, i)
                        if nbytes > free_bytes:
                            card["oom_events"] += 1
                            st.dirty = True
                            raise SimOOM(card["pci"], i, card["name"], nbytes, card["total_bytes"],
                                         card["total_bytes"] - free_bytes, free_bytes)
                    p["card"][card["pci"]] = held + sign * nbytes
                    st.dirty = True
                    return
            time.sleep(poll_s)

    # ---- checkpoint transitions (reference "cuda-checkpoint", "States") ---------------------------

    def lock(self, pid: int) -> None:
        """running → locked; anything else is CUDA error 401 (illegal state)."""
        self._move(pid, RUNNING, LOCKED, "lock")

    def unlock(self, pid: int) -> None:
        """locked → running; anything else is 401."""
        self._move(pid, LOCKED, RUNNING, "unlock")

    def checkpoint(self, pid: int) -> int:
        """locked → checkpointed: every card byte moves to the host area and leaves the card.
        Returns the bytes moved. Raises :class:`SimError` 401 from any other state."""
        with store.transaction(self.directory) as st:
            p = self._edge(st.data, pid, LOCKED, "checkpoint")
            moved = 0
            for pci, n in p["card"].items():
                p["host"][pci] = p["host"].get(pci, 0) + n
                moved += n
            p["card"] = {}
            p["state"] = CHECKPOINTED
            st.dirty = True
            return moved

    def restore(self, pid: int, device_map: dict[str, str] | None = None) -> int:
        """checkpointed → locked: the host bytes come back onto their cards (or, with
        ``device_map``, onto others: :func:`_map_devices`). Returns the bytes moved. A card
        without room raises :class:`SimOOM` (CUDA error 2), counts an OOM event and leaves the
        process checkpointed and stuck; a stuck process's later restores raise
        :class:`SimError` 304 (reference "Failure classes")."""
        with store.transaction(self.directory) as st:
            p = self._edge(st.data, pid, CHECKPOINTED, "restore")
            if p["stuck"]:
                raise SimError(f"pid {pid}: an earlier restore failed; the process is stuck "
                               "checkpointed and only a kill helps", cuda_error=304)
            if device_map:
                _map_devices(st.data, p, device_map)
                st.dirty = True
            for pci, n in p["host"].items():
                i = self._index(st.data, pci)
                free_bytes = self._free(st.data, i)
                if n > free_bytes:
                    card = st.data["cards"][i]
                    card["oom_events"] += 1
                    p["stuck"] = True
                    st.dirty = True
                    raise SimOOM(pci, i, card["name"], n, card["total_bytes"],
                                 card["total_bytes"] - free_bytes, free_bytes)
            moved = sum(p["host"].values())
            p["card"], p["host"] = dict(p["host"]), {}
            p["state"] = LOCKED
            st.dirty = True
            return moved

    def _move(self, pid: int, want: str, to: str, action: str) -> None:
        with store.transaction(self.directory) as st:
            p = self._edge(st.data, pid, want, action)
            p["state"] = to
            st.dirty = True

    def _edge(self, data: dict, pid: int, want: str, action: str) -> dict:
        p = self._proc(data, pid)
        if p["state"] != want:
            raise SimError(f"pid {pid} is {p['state']}; {action} needs {want}", cuda_error=401)
        return p

    def _proc(self, data: dict, pid: int) -> dict:
        start = _start_time(pid)
        p = data["procs"].get(_key(pid, start)) if start is not None else None
        if p is None:
            raise SimError(f"pid {pid}: no such process with simulated CUDA memory in "
                           f"{self.directory}")
        return p

    # ---- the file --------------------------------------------------------------------------------

    @staticmethod
    def _free(data: dict, i: int) -> int:
        card = data["cards"][i]
        used = sum(p["card"].get(card["pci"], 0) for p in data["procs"].values())
        return card["total_bytes"] - card["baseline_bytes"] - used

    def _card_state(self, data: dict, i: int) -> CardState:
        c = data["cards"][i]
        free_bytes = self._free(data, i)
        procs = {p["pid"]: p["card"][c["pci"]] for p in data["procs"].values()
                 if c["pci"] in p["card"]}
        spec = CardSpec(**{k: c[k] for k in CardSpec.__dataclass_fields__})
        return CardState(spec=spec, index=i, free_bytes=free_bytes,
                         used_bytes=c["total_bytes"] - free_bytes, oom_events=c["oom_events"],
                         processes=procs)

    def _index(self, data: dict, pci: str) -> int:
        try:
            norm = normalize_pci(pci)
        except ValueError as e:
            raise SimError(str(e)) from None
        for i, c in enumerate(data["cards"]):
            if c["pci"] == norm:
                return i
        raise SimError(f"pci: no simulated card at {norm} in {self.directory} (have "
                       f"{', '.join(c['pci'] for c in data['cards'])})")


def _describe(cards: list[dict]) -> str:
    return ", ".join(f"{c['name']}={format_size(c['total_bytes'])}@{c['pci']}"
                     for c in cards) or "none"


def _map_devices(data: dict, p: dict, device_map: dict[str, str]) -> None:
    """Restore onto other cards (cuda-checkpoint's ``--device-map``, driver 580+; issue 35):
    ``device_map`` (UUID → UUID) must list every card ``p`` checkpointed, each new card declared
    and of the same kind (:attr:`CardSpec.model`), else :class:`SimError` 1 (invalid value) or
    801 (not supported: another kind), ``p`` left as it was. From then on ``p``'s allocations
    on an old card go to its new one, as its CUDA device ordinal now names the new card."""
    moves = _device_moves(data, p, device_map)
    p["host"] = {moves.get(pci, pci): n for pci, n in p["host"].items()}
    remap = p.setdefault("remap", {})
    for old, new in moves.items():
        for k in [k for k, v in remap.items() if v == old]:
            remap[k] = new
        remap[old] = new


def _device_moves(data: dict, p: dict, device_map: dict[str, str]) -> dict[str, str]:
    """``device_map`` (UUID → UUID) as PCI → PCI for the cards ``p`` checkpointed. Raises
    :class:`SimError` 1 for a card left out or unknown, 801 for a card of another kind."""
    cards = data["cards"]
    by_uuid = {c["uuid"]: c for c in cards}
    by_pci = {c["pci"]: c for c in cards}
    for old, new in device_map.items():
        for u in (old, new):
            if u not in by_uuid:
                raise SimError(f"--device-map: no card {u!r}", cuda_error=INVALID_VALUE)
    moves: dict[str, str] = {}
    for pci in p["host"]:
        old = by_pci[pci]
        new_uuid = device_map.get(old["uuid"])
        if new_uuid is None:
            raise SimError(f"--device-map: it must list every checkpointed card; "
                           f"{old['uuid']} ({old['name']}) is missing", cuda_error=INVALID_VALUE)
        new = by_uuid[new_uuid]
        old_kind, new_kind = old.get("model", DEFAULT_MODEL), new.get("model", DEFAULT_MODEL)
        if old_kind != new_kind:
            raise SimError(f"cannot restore onto {new['name']} ({new_kind}): the process was "
                           f"checkpointed on {old['name']} ({old_kind}), and a checkpoint "
                           f"restores only onto a card of the same kind",
                           cuda_error=NOT_SUPPORTED)
        moves[pci] = new["pci"]
    return moves
