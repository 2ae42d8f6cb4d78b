"""``berth.toml``: the schema (pydantic), and errors that name every bad key and value.

Source: DESIGN.md "Config"; issue 4; issue 11. Sizes are strings with binary units
(``"24GiB"``) or the word ``card``; durations are strings like ``"20s"``. Inside, every size is
bytes and every duration seconds. :func:`load` raises :class:`ConfigError` listing *every*
problem by its key path, e.g. ``cards.gpu0.reserve: expected a size like '24GiB', got 'lots'``.

- :mod:`.values`: each value on its own (annotated types);
- :mod:`.models`: one model per table, with the rules inside a table;
- :mod:`.cross`: values against each other (a card's reserve against its total, an engine's size
  against its card), on the typed models, in :class:`Config`'s after-validator;
- :mod:`.loading`: :func:`load`, :func:`parse`, :func:`load_config` (the one every process
  calls), and :func:`plugin_problems` (what the config names against the registered plugins);
- :mod:`.errors`: :class:`ConfigError`, which needs no pydantic;
- :mod:`.words`: validation errors in words; :mod:`.summary`: what a config means.

The names below load their module when first used (PEP 562): the schema costs pydantic's
import, which ``berth run`` pays only after its front listens (issue 23).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported at once, both light. summary also because a submodule named like the function it
# exports would replace it as the package's attribute if the submodule were imported first.
from .errors import ConfigError
from .summary import summary

__all__ = ["Config", "ConfigError", "load", "load_config", "parse", "plugin_problems", "summary",
           "card_problems", "named_cards",
           "ApiConfig", "CardConfig", "DriverConfig", "EngineConfig", "HostsConfig",
           "NetworkConfig", "PolicyConfig", "SimCard", "SupervisorHostConfig", "MAX_CARD_BYTES",
           "MIN_READ_INTERVAL_S"]

#: The module of each name loaded on first use.
_HOME = {"load": ".loading", "load_config": ".loading", "parse": ".loading",
         "plugin_problems": ".loading", "card_problems": ".loading",
         "named_cards": ".loading", "MAX_CARD_BYTES": ".values",
         "MIN_READ_INTERVAL_S": ".values"}
_HOME.update((name, ".models") for name in __all__ if name not in _HOME and name not in globals())

if TYPE_CHECKING:
    from .loading import card_problems, load, load_config, named_cards, parse, plugin_problems
    from .models import (
                         ApiConfig,
                         CardConfig,
                         Config,
                         DriverConfig,
                         EngineConfig,
                         HostsConfig,
                         NetworkConfig,
                         PolicyConfig,
                         SimCard,
                         SupervisorHostConfig,
    )
    from .values import MAX_CARD_BYTES, MIN_READ_INTERVAL_S


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
