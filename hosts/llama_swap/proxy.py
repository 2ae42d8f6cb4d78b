"""Step 3 of ``berth llama-swap wrap``: where requests reach a model's engine once it runs
under ``berth run``.

Source: issue 5 and issue 12 case 8; reference/llama-swap.md (``proxy`` defaults to
``http://localhost:${PORT}``; ``${PORT}`` is assigned only to models whose ``cmd`` holds it).

(a) ``proxy`` unset or using ``${PORT}``: the front listens on ``127.0.0.1:${PORT}``, so the
    proxy, now pointing at the front, is unchanged.
(b) ``proxy`` a fixed address and no ``${PORT}`` in ``cmd`` (the engine has its own fixed
    port): the front gets a new ``${PORT}`` from llama-swap, ``proxy`` becomes
    ``http://127.0.0.1:${PORT}`` (its path kept), and ``--upstream`` tells ``berth run`` where
    the engine listens.
(c) Refused: a proxy whose host is not loopback (``127.0.0.0/8``, ``::1``, ``localhost``;
    ``0.0.0.0`` reaches this host too): Berth leases this machine's GPU memory, so the engine
    must run here; with ``${PORT}`` only ``127.0.0.1``/``localhost``/``0.0.0.0``, where the
    front listens. Also refused: no ``${PORT}`` in ``cmd`` and no ``proxy`` (llama-swap refuses
    that too), and a fixed ``proxy`` while ``cmd`` also holds ``${PORT}``: llama-swap sends
    requests to the fixed address while the engine is given ``${PORT}``, and wrap cannot tell
    which of the two the engine listens on (``--upstream`` to the fixed address would forward
    to a port the engine may not use, ``{port}`` would leave the fixed port unserved), so the
    user makes them agree.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import command
from .command import PORT

__all__ = ["FRONT_HOST", "Front", "front", "address", "ProxyError"]

#: Where every front listens; llama-swap and the engines are on the same machine.
FRONT_HOST = "127.0.0.1"


class ProxyError(ValueError):
    """A ``proxy`` wrap refuses; the message names the model's key."""


@dataclass
class Front:
    """What step 3 decided for one model. ``upstream``: the engine's own URL for
    ``--upstream`` (case b) or ``None``; ``proxy``: the model's new ``proxy`` or ``None`` to
    keep it; ``path``: the proxy's path (``--health`` goes under it); ``fixed``: the engine's
    fixed ``host:port``, for finding models that share one; ``note``: what changed, in words."""

    upstream: str | None
    proxy: str | None
    path: str
    fixed: str | None = None
    note: str | None = None


def this_host(host: str | None) -> bool:
    """Whether a proxy host reaches a front listening on :data:`FRONT_HOST`."""
    return host in ("localhost", FRONT_HOST, "0.0.0.0")


def _loopback(host: str | None) -> bool:
    """Whether an engine at ``host`` runs on this machine: ``localhost``, ``127.0.0.0/8``,
    ``::1`` (or IPv4-mapped loopback), or ``0.0.0.0``/``::``, which connect to this host."""
    if not host:
        return False
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def address(parts) -> str:
    """``host:port`` of a parsed URL, the names of this host as :data:`FRONT_HOST`."""
    host = FRONT_HOST if this_host(parts.hostname) else parts.hostname
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def front(mid: str, conf: dict, scope: command.Macros, has_port: bool) -> Front:
    """Step 3 for model ``mid`` (its mapping ``conf``, its macros ``scope``; ``has_port``:
    its ``cmd`` holds ``${PORT}`` once macros are expanded). Raises :class:`ProxyError`."""
    raw = conf.get("proxy")
    text = "http://localhost:${PORT}" if raw is None else str(raw)
    expanded = command.expand(text, scope)
    where = f"models.{mid}.proxy"
    if PORT in expanded:                                                    # (a)
        if not has_port:
            raise ProxyError(f"{where}: {'unset, so it is ' if raw is None else ''}{text!r}, "
                             f"which uses ${{PORT}}, but cmd has no ${{PORT}} (llama-swap "
                             f"refuses this too); give the engine --port ${{PORT}}, or set proxy "
                             f"to the fixed address the engine listens on")
        parts = urlsplit(expanded.replace(PORT, "5800"))
        try:
            port = parts.port
        except ValueError:
            port = None
        if port != 5800:
            raise ProxyError(f"{where}: ${{PORT}} must be the URL's port, got {text!r}")
        if not this_host(parts.hostname):
            raise ProxyError(f"{where}: {text!r} points at {parts.hostname}, but berth run's "
                             f"front listens on {FRONT_HOST}; set proxy to "
                             f"http://{FRONT_HOST}:${{PORT}} or leave it out")
        return Front(None, None, parts.path)
    parts = urlsplit(expanded)
    try:
        _ = parts.port
    except ValueError:                      # a port that is not a number
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProxyError(f"{where}: expected a URL like http://127.0.0.1:8999, got {text!r}")
    if not _loopback(parts.hostname):                                       # (c)
        raise ProxyError(f"{where}: {text!r} points at {parts.hostname}, another host: berth "
                         f"run leases this machine's GPU memory for the engine, so the engine "
                         f"must run here and listen on loopback (127.0.0.1, ::1 or localhost); "
                         f"run this model's llama-swap and berthd on {parts.hostname} instead")
    if has_port:                                                            # (c)
        raise ProxyError(f"{where}: {text!r} is a fixed address, yet cmd also gives the engine "
                         f"${{PORT}}: llama-swap sends requests to {address(parts)} while the "
                         f"engine is given another port, and wrap will not guess which one it "
                         f"listens on; if it listens on ${{PORT}}, drop proxy (or set it to "
                         f"http://127.0.0.1:${{PORT}}); if on {address(parts)}, take ${{PORT}} "
                         f"out of cmd")
    own = urlsplit(text)                                                    # (b)
    if not (own.scheme and own.netloc):    # the whole URL comes from a macro
        own = parts
    upstream = f"{own.scheme}://{own.netloc}"
    proxy = f"http://{FRONT_HOST}:${{PORT}}{own.path}" + (f"?{own.query}" if own.query else "")
    note = (f"models.{mid}: its engine listens on the fixed address {upstream}; berth run "
            f"fronts it on a port llama-swap assigns (proxy is now {proxy}) and forwards there "
            f"(--upstream)")
    return Front(upstream, proxy, own.path, address(parts), note)
