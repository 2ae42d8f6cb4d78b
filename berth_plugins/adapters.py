"""The adapters' registry: the entry-point group ``berth.adapters``, read without importing any
adapter.

Source: issue 38 ("adapters register like hosts"); DESIGN.md "The code" (third parties come
through entry points). An adapter is a pluggy plugin that carries out ``park = "hook"`` (and
lend) for one kind of engine. It registers as ``NAME = "module"`` under
``[project.entry-points."berth.adapters"]`` of its distribution's ``pyproject.toml``: ``NAME`` is
the adapter's name (``adapter = NAME`` in berth.toml, ``berth run --adapter NAME``) and must be
among the mechanisms its module's ``berth_mechanisms`` returns. Berth's own adapters register the
same way, in Berth's ``pyproject.toml``; nothing else of Berth names them. The plugin manager
(:mod:`berth_plugins.manager`) loads and checks them; this module only lists them, for help
texts and error messages (``berth run --help`` reads it on every start: no adapter is imported).
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["GROUP", "OWN_DISTRIBUTION", "PROTOCOL", "entry_points", "names"]

#: The entry-point group adapters register under.
GROUP = "berth.adapters"
#: Berth's own distribution: its adapters are loaded even without third parties'.
OWN_DISTRIBUTION = "berth-gpu"
#: The adapter of an engine that speaks Berth's own engine protocol (DESIGN.md "The Berth engine
#: protocol"): a lend with no adapter named uses it.
PROTOCOL = "protocol"


def entry_points(own_only: bool = False, found: importlib.metadata.EntryPoints | None = None
                 ) -> list[importlib.metadata.EntryPoint]:
    """The installed adapters' entry points, by name (``own_only``: Berth's own only). Two
    distributions may declare one name: both are returned (the manager refuses the pair).
    ``found``: every group's entry points, read once by a caller that reads other groups too
    (each read parses every installed distribution's entry_points.txt)."""
    if own_only:
        try:
            found = importlib.metadata.distribution(OWN_DISTRIBUTION).entry_points
        except importlib.metadata.PackageNotFoundError:
            return []
        return sorted(found.select(group=GROUP), key=lambda ep: ep.name)
    if found is None:
        found = importlib.metadata.entry_points(group=GROUP)
    return sorted(found.select(group=GROUP), key=lambda ep: ep.name)


def names() -> list[str]:
    """The installed adapters' names, sorted, each once (nothing is imported)."""
    return sorted({ep.name for ep in entry_points()})
