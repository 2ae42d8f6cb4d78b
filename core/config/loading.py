"""Reading berth.toml: :func:`load`, :func:`parse`, :class:`ConfigError`, and what a config
names against the plugins (:func:`plugin_problems`) and against the cards a driver sees
(:func:`card_problems`, :func:`named_cards`)."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Iterable

from berth import paths
from berth.decide.kinds import names_card
from pydantic import ValidationError

from .cross import RAW, RULES_OFF, UNKNOWN
from .errors import ConfigError, in_words
from .models import CROSS, Config
from .words import is_secret, key_str, loc_str, unknown_key


def parse(data: dict, source: str = "berth.toml") -> Config:
    """Validate a parsed TOML document. Raises :class:`ConfigError` listing every problem: each
    value's own, and (validating again without the refused values, see :mod:`.cross`) every
    problem between the values that are left."""
    try:
        return Config.model_validate(data, context={RAW: data})
    except ValidationError as e:
        errors = e.errors()
    if isinstance(data, dict):
        errors += _hidden(data, errors)
    raise ConfigError(source, _in_words(data, errors))


def _loc(err: dict) -> tuple:
    """An error's key path without pydantic's validator steps."""
    return tuple(x for x in err["loc"] if not (isinstance(x, str) and (
        x.startswith("function-") or x.startswith("Annotated["))))


def _hidden(data: dict, errors: list[dict]) -> list[dict]:
    """The problems that refused values hid (an after-validator runs only on a model whose
    values all passed): validate again with the refused values left out, their key paths
    handed to the checks as unknown; once only a table's own rules still fail (their values
    are fine), once more with those rules off, so the checks between tables run too."""
    unknown: set[tuple] = set()
    rules_off = False
    seen = {(_loc(x), x["msg"]) for x in errors}
    found: list[dict] = []
    for _ in range(6):
        bad, ruled = set(), False
        for x in errors:
            loc = _loc(x)
            if x["type"] == CROSS or any(loc[:len(u)] == u for u in unknown):
                continue
            if loc and x["type"] != "extra_forbidden" and isinstance(_at(data, loc), dict):
                ruled = True                   # a table's own rule: its values passed
            else:
                bad.add(loc)
        if () in bad or not (bad or ruled) or (not bad and rules_off):
            break
        unknown |= bad
        rules_off = rules_off or not bad
        try:
            Config.model_validate(_without(data, unknown), context={
                UNKNOWN: frozenset(unknown), RAW: data, RULES_OFF: rules_off})
            break
        except ValidationError as e:
            errors = e.errors()
        for x in errors:
            loc = _loc(x)
            refused_again = any(loc[:len(u)] == u for u in unknown)   # a stand-in's, not new
            if (loc, x["msg"]) not in seen and not refused_again:
                seen.add((loc, x["msg"]))
                found.append(x)
    return found


def _at(data: Any, loc: tuple) -> Any:
    """The value at ``loc`` in the document, ``None`` if there is none."""
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _without(data: Any, paths: set[tuple]) -> Any:
    """A copy of ``data`` without the values at ``paths``. In a list of tables a refused entry
    becomes an empty table (the entries after it keep their indices, which the checks report);
    in any other list it is dropped."""
    def walk(x: Any, here: tuple) -> Any:
        if isinstance(x, dict):
            return {k: walk(v, (*here, k)) for k, v in x.items() if (*here, k) not in paths}
        if isinstance(x, list):
            tables = any(isinstance(v, dict) for v in x)    # keep the entries' indices
            return [walk(v, (*here, i)) if (*here, i) not in paths else {}
                    for i, v in enumerate(x) if (*here, i) not in paths or tables]
        return x
    return walk(data, ())


def _in_words(data: Any, errors: list[dict]) -> list[tuple[str, str]]:
    """``(key path, message)`` pairs in the order of berth.toml's tables, an entry's together."""
    order = list(Config.model_fields)
    problems = []
    for err in errors:
        loc = _loc(err)
        msg = in_words(err)
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            loc, msg = unknown_key(loc, value, Config)
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            # pydantic's words name a Python class ("instance of EngineConfig"); a user wrote TOML.
            msg = f"expected a table ([{loc_str(loc)}] with its keys), got {value!r}"
        elif loc and is_secret(loc[-1]):
            # a key or password is never written back (berthd's log, a terminal, a paste),
            # not even where a validator's own words quote it
            if isinstance(value, str) and value:
                msg = msg.replace(repr(value), "its value")
                if len(value) >= 6:         # a shorter one would match inside words
                    msg = msg.replace(value, "its value")
                msg += f" (got {len(value)} characters)"
        elif err["type"] not in ("value_error", CROSS) and not isinstance(value, dict):
            msg += f" (got {value!r})"
        rank = (order.index(loc[0]) if loc and loc[0] in order else len(order), 0)
        if len(loc) > 1 and loc[0] in ("engines", "cards") and isinstance(
                data.get(loc[0]), dict) and loc[1] in data[loc[0]]:
            rank = (rank[0], list(data[loc[0]]).index(loc[1]))   # an entry's problems together
        problems.append((rank, loc_str(loc) or "(top)", msg))
    problems.sort(key=lambda p: p[0])
    return [(k, m) for _, k, m in problems]


def load(path: str | Path) -> Config:
    """Read and validate ``path``. Raises :class:`ConfigError` (also for a missing file or
    malformed TOML, naming the line)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(p), [("(file)", "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError(str(p), [("(file)", "is a directory; give the path of berth.toml "
                                               "itself")]) from None
    except PermissionError:
        raise ConfigError(str(p), [("(file)", "cannot be read (permission denied)")]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), [("(file)", f"not UTF-8 text (TOML must be UTF-8): byte "
                                               f"{e.object[e.start]:#04x} at offset {e.start}")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(p), [("(toml)", str(e))]) from None
    return parse(data, str(p))


def load_config(path: str | Path | None = None) -> tuple[Config, Path | None]:
    """The config every Berth process runs on (berthd, ``berth run``, ``berth status`` and the
    client, the gateway, the hosts): the file :func:`berth.paths.find_config` finds (``path``
    from ``--config``, else ``$BERTH_CONFIG``, else the default place), or the defaults (NVML)
    when none is named and the default place has none. Returns the config and its file
    (``None``: the defaults). Raises :class:`ConfigError`: a named file that does not exist, or
    one that does not load, is never passed over for the defaults."""
    found = paths.find_config(path)
    return (load(found), found) if found is not None else (Config(), None)


def plugin_problems(cfg: Config, known: set[str],
                    adapters: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Engine entries naming a mechanism no plugin carries out: ``(key path, message)`` pairs.

    ``known`` is every mechanism the registered plugins carry out (built-ins and entry points:
    :func:`berth_plugins.manager.mechanisms`); ``adapters`` the registered adapters' names that
    messages list (:func:`berth_plugins.manager.adapters`; ``None``: ``known``). An entry needs
    its ``adapter`` for ``park = 'hook'`` and for ``lend`` (Berth's own protocol's adapter when
    none is named, :data:`berth_plugins.adapters.PROTOCOL`), and ``supervisor`` for a
    ``supervisor`` program (hookspecs ``berth_mechanisms``). Source: issue 38 (the registry)."""
    from berth_plugins.adapters import PROTOCOL
    names = ", ".join(sorted(known)) or "none"
    adapter_names = ", ".join(sorted(known if adapters is None else adapters)) or "none"
    out = []
    for name, e in cfg.engines.items():
        if e.adapter and e.adapter not in known:
            close = difflib.get_close_matches(e.adapter, sorted(known), 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append((f"engines.{key_str(name)}.adapter",
                        f"no plugin carries out adapter {e.adapter!r}{hint}; known adapters: "
                        f"{adapter_names}"))
        elif not e.adapter and e.lend and PROTOCOL not in known:
            out.append((f"engines.{key_str(name)}.lend",
                        f"lend without an adapter uses {PROTOCOL!r}, which no plugin carries "
                        f"out; known adapters: {adapter_names}"))
        if e.park and e.park != "hook" and e.park not in known:
            out.append((f"engines.{key_str(name)}.park",
                        f"no plugin carries out park {e.park!r}; known mechanisms: {names}"))
        if e.supervisor and "supervisor" not in known:
            out.append((f"engines.{key_str(name)}.supervisor",
                        f"no plugin carries out 'supervisor' (is berth_hosts' entry point "
                        f"installed?); known mechanisms: {names}"))
    return out




def named_cards(cfg: Config) -> list[tuple[str, str]]:
    """Every card the config names, ``(key path, the name or PCI address)``: each ``[cards.X]``
    entry's key and each engine's ``card``."""
    out = [(f"cards.{key_str(key)}", key) for key in cfg.cards]
    out += [(f"engines.{key_str(name)}.card", e.card) for name, e in cfg.engines.items()
            if e.card is not None]
    return out


def card_problems(cfg: Config, seen: list[tuple[str, str]], driver: str
                  ) -> list[tuple[str, str]]:
    """:func:`named_cards` that no card ``driver`` sees answers to: ``(key path, message)``
    pairs. ``seen`` is each card's ``(PCI address, name)`` as berthd names it (``gpuN`` in the
    driver's order). A ``[cards.X]`` key matches that name, an engine's ``card`` the name the
    card's ``[cards.X] name`` gives it, as berthd's ledger matches them."""
    shown = [(pci, cfg.card_config(pci, name).name or name) for pci, name in seen]
    listed = ", ".join(f"{name} ({pci})" for pci, name in shown) or "none"
    out = []
    for key, card in named_cards(cfg):
        against = seen if key.startswith("cards.") else shown
        if any(names_card(card, pci, name) for pci, name in against):
            continue
        renamed = next((n for (_, old), (_, n) in zip(seen, shown, strict=True)
                        if old == card != n), None)
        hint = (f"; [cards.{key_str(card)}] shows it as {renamed!r}: use that name or its PCI "
                f"address" if renamed else "")
        out.append((key, f"no card {driver} sees is named {card!r} or has that PCI address "
                         f"({driver} sees: {listed}){hint}"))
    return out
