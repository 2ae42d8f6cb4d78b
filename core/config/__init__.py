"""``berth.toml``: the schema (pydantic), and errors that name every bad key and value.

Source: DESIGN.md "Config"; issue 4; issue 11. Sizes are strings with binary units
(``"24GiB"``) or the word ``card``; durations are strings like ``"20s"``. Inside, every size is
bytes and every duration seconds. :func:`load` raises :class:`ConfigError` listing *every*
problem by its key path, e.g. ``cards.gpu0.reserve: expected a size like '24GiB', got 'lots'``.

- :mod:`.values`: each value on its own (annotated types);
- :mod:`.models`: one model per table, with the rules inside a table;
- :mod:`.cross`: values against each other (a card's reserve against its total, an engine's size
  against its card), on the typed models, in :class:`Config`'s after-validator;
- :mod:`.loading`: :func:`load`, :func:`parse`, :func:`load_config`, :class:`ConfigError`, and
  :func:`plugin_problems` (what the config names against the registered plugins);
- :mod:`.words`: validation errors in words; :mod:`.summary`: what a config means.
"""

from __future__ import annotations

from .loading import ConfigError, load, load_config, parse, plugin_problems
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
from .summary import summary
from .values import MAX_CARD_BYTES, MIN_READ_INTERVAL_S

__all__ = ["Config", "ConfigError", "load", "load_config", "parse", "plugin_problems", "summary",
           "ApiConfig", "CardConfig", "DriverConfig", "EngineConfig", "HostsConfig",
           "NetworkConfig", "PolicyConfig", "SimCard", "SupervisorHostConfig", "MAX_CARD_BYTES",
           "MIN_READ_INTERVAL_S"]
