"""berth.toml's values against each other, read from the typed models.

Source: DESIGN.md "Config"; issue 4; issue 11 ("checks on the typed models"). Checked: simulated
cards declared with ``driver.kind = 'sim'`` and only then, no name or PCI address twice, a
``[cards.X]`` naming a declared card (once), a card's reserve, claims and baselines against its
total and leaving memory to grant, an engine's need within its size, its ``lend_max`` only with
``lend = true``, its ``card`` a declared card, its size what that card (or some card) can ever
grant.

:func:`problems` runs in :class:`berth.config.models.Config`'s after-validator. When some value
is wrong on its own, :func:`berth.config.loading.parse` validates a second time without the
wrong values and hands their key paths over as ``unknown`` (the validation context's
:data:`UNKNOWN`): a check that would read one of them is skipped, so one bad value hides no
other problem and adds no false one. Messages quote a value as the file wrote it (the context's
:data:`RAW` document), else in binary units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from berth.decide.kinds import names_card
from berth.decide.units import format_size

from .values import DEFAULT_RESERVE_BYTES
from .words import key_str

if TYPE_CHECKING:
    from .models import Config

__all__ = ["UNKNOWN", "RAW", "RULES_OFF", "problems", "rules_off"]

#: Validation-context key: the key paths (tuples) of values refused on their own.
UNKNOWN = "berth_unknown"
#: Validation-context key: the document as read, to quote values as the file wrote them.
RAW = "berth_raw"
#: Validation-context key: a table's own rules were already reported; check only across tables.
RULES_OFF = "berth_rules_off"


def rules_off(context: dict | None) -> bool:
    """Whether a table's own after-validator should let its rules be (see :data:`RULES_OFF`)."""
    return bool((context or {}).get(RULES_OFF))

Problem = tuple[tuple, str, Any]         # key path, message, value


class _View:
    """Which key paths hold values that were refused (and so were left out), and the values as
    written."""

    def __init__(self, unknown: frozenset[tuple], raw: Any):
        self.unknown, self.raw = unknown, raw

    def known(self, *loc) -> bool:
        """Neither the value at ``loc``, nor a table holding it, nor anything in it was refused."""
        n = len(loc)
        return not any(u[:n] == loc or loc[:len(u)] == u for u in self.unknown)

    def written(self, loc: tuple, value: Any) -> str:
        """The value at ``loc`` as the file wrote it (repr), else ``value`` in binary units."""
        x = self.raw
        for part in loc:
            if isinstance(x, dict) and part in x:
                x = x[part]
            elif isinstance(x, list) and isinstance(part, int) and part < len(x):
                x = x[part]
            else:
                return format_size(value) if isinstance(value, int) else repr(value)
        return repr(x)


@dataclass
class _Card:
    """One simulated card with its ``[cards.X]`` entry; ``None`` for a value that was refused."""
    i: int
    pci: str | None
    name: str | None
    total: int | None
    sim_baseline: int | None
    key: str | None = None                 # its [cards.X] entry, if any
    reserve: int | None = None
    claims: dict[str, int | None] = field(default_factory=dict)
    baseline: int | None = None            # [cards.X] baseline (None: the simulated card's)
    baseline_known: bool = True
    shown: str | None = None               # [cards.X] name

    def known(self) -> bool:
        return self.pci is not None and self.name is not None

    def label(self) -> str:
        return self.name if self.name is not None else f"driver.cards.{self.i}"

    def where(self, *rest) -> tuple:
        return ("cards", self.key, *rest) if self.key is not None else ("driver", "cards", self.i)

    def base(self) -> int | None:
        if not self.baseline_known:
            return None
        return self.baseline if self.baseline is not None else self.sim_baseline

    def capacity(self) -> int | None:
        """total − reserve − claims − baseline (bytes), or None when one of them was refused."""
        parts = [self.total, self.reserve, self.base(), *self.claims.values()]
        return None if any(p is None for p in parts) else parts[0] - sum(parts[1:])

    def sums(self) -> str:
        s = f"{format_size(self.total)} total − {format_size(self.reserve)} reserve"
        if self.claims:
            s += f" − {format_size(sum(self.claims.values()))} claims"
        return s + f" − {format_size(self.base())} baseline"


def problems(cfg: "Config", unknown: frozenset[tuple] = frozenset(), raw: Any = None
             ) -> list[Problem]:
    """Every problem between values of ``cfg``: ``(key path, message, value)`` triples."""
    v = _View(unknown, raw)
    out: list[Problem] = []
    drv = cfg.driver
    kind = drv.kind if v.known("driver", "kind") else None
    if kind == "sim" and not drv.cards and v.known("driver", "cards"):
        out.append((("driver",), "driver.kind = 'sim' needs at least one [[driver.cards]] entry "
                                 "(pci, name, total)", None))
    if kind == "nvml" and (drv.cards or not v.known("driver", "cards")):
        out.append((("driver",), "[[driver.cards]] declares simulated cards; set "
                                 "driver.kind = 'sim'", None))
    sims = [_Card(i, *(getattr(c, f) if v.known("driver", "cards", i, f) else None
                       for f in ("pci", "name", "total", "baseline")))
            for i, c in enumerate(drv.cards)]
    for label in ("name", "pci"):
        seen: dict[str, int] = {}
        for c in sims:
            x = getattr(c, label)
            if x is not None and x in seen:
                out.append((("driver", "cards", c.i, label),
                            f"duplicate {label} {x!r}: driver.cards.{seen[x]} has it too", x))
            elif x is not None:
                seen[x] = c.i
    all_known = kind == "sim" and all(c.known() for c in sims)
    declared = ", ".join(f"{c.name} ({c.pci})" for c in sims if c.known())
    out += _card_entries(cfg, v, sims, kind, all_known, declared)
    if kind == "sim":
        for c in sims:
            out += _card_problems(c)
    out += _engines(cfg, v, sims, all_known, declared)
    return out


def _card_entries(cfg, v: _View, sims: list[_Card], kind, all_known: bool, declared: str
                  ) -> list[Problem]:
    """``[cards.X]``: which simulated card each names; its values go onto that card."""
    out: list[Problem] = []
    for c in sims:
        c.reserve = DEFAULT_RESERVE_BYTES           # until an entry says otherwise
    for key, cc in cfg.cards.items():
        owner = next((c for c in sims if c.known() and names_card(key, c.pci, c.name)), None)
        if owner is None:
            if kind == "sim" and all_known:
                out.append((("cards", key), f"no simulated card is named {key!r} or has that PCI "
                                            f"address (declared: {declared})", key))
            continue
        if owner.key is not None:
            out.append((("cards", key), f"card {owner.name} ({owner.pci}) is already configured "
                                        f"by [cards.{key_str(owner.key)}]; this entry is ignored: "
                                        f"merge them", key))
            continue
        at = ("cards", key)
        owner.key = key
        owner.reserve = cc.reserve if v.known(*at, "reserve") else None
        owner.claims = {k: (x if v.known(*at, "claims", k) else None)
                        for k, x in cc.claims.items()}
        if not v.known(*at, "claims"):
            owner.claims[""] = None            # a claim was refused: the sum is unknown
        owner.baseline, owner.baseline_known = cc.baseline, v.known(*at, "baseline")
        owner.shown = cc.name if v.known(*at, "name") else None
    return out


def _card_problems(c: _Card) -> list[Problem]:
    """One simulated card's reserve, claims and baseline against its total."""
    if c.total is None:
        return []
    out: list[Problem] = []
    total, label = format_size(c.total), c.label()
    if c.reserve is not None and c.reserve >= c.total:
        what = "reserve" if c.key is not None else "the default reserve (no [cards.X] entry)"
        out.append((c.where("reserve") if c.key is not None else ("driver", "cards", c.i, "total"),
                    f"{what} {format_size(c.reserve)} is the whole card or more: {label} has "
                    f"{total} total, and the reserve is never granted", c.reserve))
    for k, x in c.claims.items():
        if x is not None and x >= c.total:
            out.append((c.where("claims", k), f"claim {k!r} of {format_size(x)} is the whole card "
                                              f"or more: {label} has {total} total", x))
    if c.baseline_known and c.baseline is not None and c.baseline >= c.total:
        out.append((c.where("baseline"), f"baseline {format_size(c.baseline)} is the whole card "
                                         f"or more: {label} has {total} total", c.baseline))
    if c.sim_baseline is not None and c.sim_baseline >= c.total:
        out.append((("driver", "cards", c.i, "baseline"),
                    f"baseline {format_size(c.sim_baseline)} is the whole card or more: {label} "
                    f"has {total} total", c.sim_baseline))
    cap = c.capacity()
    if not out and cap is not None and cap <= 0:
        out.append((c.where(), f"no memory would be left to grant on {label}: {c.sums()} = "
                               f"{format_size(cap)}", None))
    return out


#: As berthd's lease body takes an engine name (berth.daemon.api_bodies).
_ENGINE_NAME = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")


def _engines(cfg, v: _View, sims: list[_Card], all_known: bool, declared: str
             ) -> list[Problem]:
    """Engines: need within size; lend_max only with lend; on simulated cards, a card that
    exists and a size that fits."""
    out: list[Problem] = []
    by_key: dict[str, _Card] = {}
    for c in sims:
        if c.known():
            by_key[c.pci] = c
            by_key[c.shown if c.shown is not None else c.name] = c
    for name, e in cfg.engines.items():
        at = ("engines", name)
        if not _ENGINE_NAME.match(name):
            # berthd's API refuses such a name for a lease (a run of this entry could never be
            # granted), and the board and the gateway show names as given.
            out.append((at, f"engine name {name!r}: an engine's name has no spaces or control "
                            f"characters (1 to 200 of them), as berthd's API takes it", name))
        size, size_known = e.size, v.known(*at, "size")
        need = e.need if v.known(*at, "need") else None
        if size_known and size is not None and need is not None and need > size:
            out.append(((*at, "need"), f"need {v.written((*at, 'need'), need)} is more than the "
                                       f"engine's size {v.written((*at, 'size'), size)}: the need "
                                       f"is what it uses of its size", need))
        if (e.lend_max is not None and not e.lend and v.known(*at, "lend_max")
                and v.known(*at, "lend")):
            # A cap on lending with no lending means nothing; taken, it hid the missing lend.
            out.append(((*at, "lend_max"), f"lend_max {v.written((*at, 'lend_max'), e.lend_max)}"
                                           f" is set but the engine does not lend (lend is "
                                           f"false): set lend = true, or remove lend_max",
                        e.lend_max))
        if all_known and v.known(*at, "card"):
            out += _engine_on_sim_cards(at, e, v, sims, by_key, declared, need)
    return out


def _engine_on_sim_cards(at: tuple, e, v: _View, sims: list[_Card], by_key: dict[str, _Card],
                         declared: str, need: int | None) -> list[Problem]:
    """One engine on simulated cards: the card it names exists, and its size (or, for the
    whole card, its need) is no more than what a card can ever grant."""
    target = None
    if e.card is not None:
        target = by_key.get(e.card)
        if target is None:
            renamed = next((c for c in sims if c.name == e.card and c.shown is not None), None)
            hint = (f"; [cards.{key_str(renamed.key)}] shows it as {renamed.shown!r}: use that "
                    f"name or its PCI address" if renamed else "")
            return [((*at, "card"), f"no simulated card is named "
                                    f"{v.written((*at, 'card'), e.card)} or has that PCI "
                                    f"address (declared: {declared}){hint}", e.card)]
    size = e.size
    if not v.known(*at, "size"):
        return []
    if size is None:            # the whole card: its need must fit what the card grants
        cap = target.capacity() if target is not None else None
        if cap is not None and cap > 0 and need is not None and need > cap:
            return [((*at, "need"), f"need {v.written((*at, 'need'), need)} is more than "
                                    f"{target.name} can ever grant: {target.sums()} = "
                                    f"{format_size(cap)}", need)]
        return []
    if target is not None:
        cap = target.capacity()
        if cap is not None and cap > 0 and size > cap:
            return [((*at, "size"), f"size {v.written((*at, 'size'), size)} is more than "
                                    f"{target.name} can ever grant: {target.sums()} = "
                                    f"{format_size(cap)}", size)]
    elif sims:
        caps = [(c.capacity(), c) for c in sims]
        if all(cap is not None for cap, _ in caps):
            best, c = max(caps, key=lambda x: x[0])
            if best > 0 and size > best:
                return [((*at, "size"), f"size {v.written((*at, 'size'), size)} is more "
                                        f"than any simulated card can ever grant (the most "
                                        f"is {c.name}: {c.sums()} = {format_size(best)})", size)]
    return []
