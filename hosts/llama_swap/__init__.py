"""The llama-swap host: every llama-swap model's ``cmd`` runs under ``berth run``.

``berth llama-swap wrap CONFIG.yaml`` (:mod:`.cli`, :mod:`.wrap`) rewrites a llama-swap config:
the run takes a lease from berthd, fronts the engine on llama-swap's ``${PORT}`` and starts the
engine on a port of its own (``{port}``); groups let llama-swap keep models loaded together so
Berth decides who parks (:mod:`.groups`). :mod:`.command` parses a ``cmd`` the way llama-swap
does. README.md in this folder shows a config before and after, and the settings that matter.
"""

from .wrap import Report, WrapError, WrapOptions, is_wrapped, sizes_from, wrap_config, wrap_text

__all__ = ["Report", "WrapError", "WrapOptions", "is_wrapped", "sizes_from", "wrap_config",
           "wrap_text"]
