"""Groups for a wrapped config: llama-swap keeps models loaded together, Berth decides who parks.

Source: reference/llama-swap.md "Groups, matrix, co-residency"; llama-swap ``0bdb372``
``internal/config/config.go`` and ``load.go`` (defaults ``swap: true``, ``exclusive: true``;
ungrouped models form ``(default)`` with both true; the legacy top-level ``groups:``/``matrix:``
and ``routing.router`` must not be mixed; under ``routing.router.settings`` both ``groups`` and
``matrix`` may be present and ``use`` picks one).

Left as it was, llama-swap would stop one engine before starting the next (a swap), and Berth
would only ever see one engine at a time. So, in order:

1. Every group gets ``swap: false`` (its members may run together) and ``exclusive: false``
   (loading it stops no other group). ``members`` and ``persistent`` are kept; with nothing
   exclusive left, ``persistent`` no longer changes anything, and a note says to give those
   models a higher ``priority`` in berth.toml instead.
2. Exception: a group with two members that listen on the same fixed address keeps
   ``swap: true``, since those two cannot run at once (a warning names them).
3. Ungrouped models go to a new group ``berth`` (``swap: false, exclusive: false``); ungrouped
   models that share a fixed address go to a ``berth-port-<port>`` group with ``swap: true``.
4. A matrix becomes groups: legacy top-level ``matrix:`` is replaced by top-level ``groups:``;
   under ``routing.router``, ``use`` becomes ``group`` and the matrix stays in ``settings``,
   unused, for reference.

A config with no groups gets the legacy top-level ``groups:`` key, which every llama-swap
release with groups reads (an older release would ignore a ``routing`` block without a word
and swap one model at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GroupError", "Regrouping", "regroup", "BERTH_GROUP"]

#: The group for models that were in none.
BERTH_GROUP = "berth"


class GroupError(ValueError):
    """Groups or a matrix llama-swap itself would refuse; the message names the key."""


@dataclass
class Regrouping:
    """What :func:`regroup` changed: ``notes`` (expected changes) and ``warnings``."""

    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _flag(group: dict, key: str, where: str) -> bool:
    value = group.get(key, key != "persistent")
    if value is None:
        return key != "persistent"
    if not isinstance(value, bool):
        raise GroupError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _unique(name: str, taken) -> str:
    if name not in taken:
        return name
    i = 2
    while f"{name}-{i}" in taken:
        i += 1
    return f"{name}-{i}"


def _rewrite(groups: dict, where: str, models: list[str], clashes: dict[str, list[str]],
             out: Regrouping) -> dict:
    """Steps 1–3 on one ``groups`` mapping; returns the new mapping (order kept)."""
    new: dict = {}
    grouped: set[str] = set()
    for name, group in groups.items():
        new[name], members = _rewrite_group(group, f"{where}.{name}", clashes, out)
        grouped.update(members)
    unknown = sorted(set(grouped) - set(models))
    if unknown:
        out.warnings.append(f"{where}: members {unknown} are not models of this config")
    _group_the_rest(new, [m for m in models if m not in grouped], where, clashes, out)
    _warn_split_addresses(new, where, clashes, out)
    return new


def _rewrite_group(group, gwhere: str, clashes: dict[str, list[str]],
                   out: Regrouping) -> tuple[dict, list[str]]:
    """Steps 1 and 2 on one group: ``(the new group, its members)``. Raises
    :class:`GroupError` naming the key for a group llama-swap would refuse."""
    group = {} if group is None else group
    if not isinstance(group, dict):
        raise GroupError(f"{gwhere}: expected a mapping with members, swap, exclusive, "
                         f"persistent; got {type(group).__name__}")
    members = group.get("members") or []
    if not isinstance(members, list):
        raise GroupError(f"{gwhere}.members: expected a list of model IDs")
    members = [str(m) for m in members]
    swap, exclusive = _flag(group, "swap", gwhere), _flag(group, "exclusive", gwhere)
    persistent = _flag(group, "persistent", gwhere)
    clash = [c for c in clashes.values() if len(set(c) & set(members)) > 1]
    if clash:
        names = "; ".join(", ".join(sorted(set(c) & set(members))) for c in clash)
        out.warnings.append(f"{gwhere}: keeps swap: true because some members listen on the "
                            f"same fixed address and cannot run at once ({names}); give "
                            f"them --port ${{PORT}} so the whole group can stay loaded")
    elif swap and len(members) > 1:
        out.notes.append(f"{gwhere}: swap true -> false: its members may stay loaded "
                         f"together; Berth parks or drains one when memory runs short")
    if exclusive:
        out.notes.append(f"{gwhere}: exclusive true -> false: loading it stops no other "
                         f"group; Berth decides who makes room")
    if persistent:
        out.notes.append(f"{gwhere}: persistent is kept but no longer matters (nothing is "
                         f"exclusive now); to keep {', '.join(members) or 'its models'} "
                         f"resident under Berth, give them a higher priority in berth.toml")
    rest = {k: v for k, v in group.items() if k not in ("swap", "exclusive")}
    return {"swap": bool(clash), "exclusive": False, **rest}, members


def _group_the_rest(new: dict, ungrouped: list[str], where: str,
                    clashes: dict[str, list[str]], out: Regrouping) -> None:
    """Step 3: ungrouped models sharing a fixed address get a ``berth-port-<port>`` group that
    swaps; the others the ``berth`` group (added to ``new``)."""
    for addr, c in clashes.items():
        alone = [m for m in c if m in ungrouped]
        if len(alone) > 1:
            gname = _unique(f"{BERTH_GROUP}-port-{addr.rsplit(':', 1)[-1]}", new)
            new[gname] = {"swap": True, "exclusive": False, "members": alone}
            out.warnings.append(f"{where}.{gname}: new group with swap: true for {', '.join(alone)}"
                                f", which listen on the same fixed address and cannot run at "
                                f"once; give them --port ${{PORT}} to let them run together")
            ungrouped = [m for m in ungrouped if m not in alone]
    if ungrouped:
        gname = _unique(BERTH_GROUP, new)
        new[gname] = {"swap": False, "exclusive": False, "members": ungrouped}
        out.notes.append(f"{where}.{gname}: new group (swap: false, exclusive: false) for the "
                         f"models that were in no group: {', '.join(ungrouped)}")


def _warn_split_addresses(new: dict, where: str, clashes: dict[str, list[str]],
                          out: Regrouping) -> None:
    """Models on one fixed address in different groups may be started together: say so."""
    group_of = {str(m): name for name, g in new.items() for m in g.get("members") or []}
    for addr, c in clashes.items():
        spread = sorted({group_of[m] for m in c if m in group_of})
        if len(spread) > 1:
            out.warnings.append(f"{where}: {', '.join(c)} listen on the same fixed address "
                                f"{addr} but sit in different groups ({', '.join(spread)}), so "
                                f"llama-swap may start them together and the second cannot "
                                f"bind; put them in one group or give them --port ${{PORT}}")


def regroup(doc: dict, models: list[str], clashes: dict[str, list[str]]) -> Regrouping:
    """Apply steps 1–4 to ``doc`` in place. ``models``: every model ID, in config order.
    ``clashes``: fixed address (``host:port``) -> the models (two or more) that listen on it.
    Raises :class:`GroupError` for a config llama-swap would refuse (both forms mixed, a
    legacy ``matrix`` beside legacy ``groups``, an unknown ``routing.router.use``)."""
    out = Regrouping()
    routing = doc.get("routing")
    router = routing.get("router") if isinstance(routing, dict) else None
    if router is not None and not isinstance(router, dict):
        raise GroupError("routing.router: expected a mapping with use and settings")
    settings = (router or {}).get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise GroupError("routing.router.settings: expected a mapping with groups or matrix")
    has_routing = bool(router) and bool(router.get("use") or (settings or {}).get("groups")
                                        or (settings or {}).get("matrix"))
    legacy_groups, legacy_matrix = doc.get("groups"), doc.get("matrix")
    if (legacy_groups or legacy_matrix is not None) and has_routing:
        raise GroupError("groups/matrix: the config uses both the legacy top-level "
                         "'groups'/'matrix' keys and 'routing.router'; llama-swap refuses that")
    if has_routing:
        use = router.get("use") or "group"
        if use not in ("group", "matrix"):
            raise GroupError(f"routing.router.use: unknown router {use!r} (valid: group, matrix)")
        if settings is None:
            settings = router["settings"] = {}
        if use == "matrix":
            router["use"] = "group"
            out.notes.append("routing.router.use: matrix -> group; the matrix stays in "
                             "routing.router.settings.matrix, unused (its sets said what fits "
                             "together; under Berth the sizes in berth.toml decide)")
        groups = settings.get("groups") or {}
        if not isinstance(groups, dict):
            raise GroupError("routing.router.settings.groups: expected a mapping of group names")
        settings["groups"] = _rewrite(groups, "routing.router.settings.groups", models,
                                      clashes, out)
        return out
    if legacy_matrix is not None and legacy_groups:
        raise GroupError("groups/matrix: the config sets both; llama-swap refuses that")
    groups = legacy_groups or {}
    if not isinstance(groups, dict):
        raise GroupError("groups: expected a mapping of group names")
    new = _rewrite(groups, "groups", models, clashes, out)
    if legacy_matrix is not None:
        out.notes.append("matrix: replaced by groups (its sets said what fits together; under "
                         "Berth the sizes in berth.toml decide)")
        rebuilt = {("groups" if k == "matrix" else k): (new if k == "matrix" else v)
                   for k, v in doc.items() if k != "groups"}
        doc.clear()
        doc.update(rebuilt)
    else:
        doc["groups"] = new
    return out
