"""Which browser pages may call a Berth listener: the ``Origin`` allow-list (issue 36, "DNS
rebinding").

ComfyUI's port compared ``Origin`` with the request's ``Host``: a page on a name its owner
rebinds to 127.0.0.1 (``http://evil.example:8188``) sends ``Host: evil.example:8188`` and the
same ``Origin``, so it passed; the gateway rewrote ``Host`` and passed ``Origin`` on unchecked.
``Host`` is the client's to choose, so it is never what an ``Origin`` is checked against. An
``Origin`` passes (:func:`refusal` returns ``None``) when it is:

1. absent (callers that are not browsers send none);
2. one of the configured origins (``[listeners] origins``: ``scheme://host[:port]``);
3. a loopback address or ``localhost`` with the port the connection came in on (this machine's
   own page: the board, ComfyUI's own page);
4. the literal address the connection came in on, with its port (the page was loaded from this
   listener by its address).

Anything else (another name, another port, ``null``, a scheme other than http and https) is
refused. The gateway passes the client's ``Origin`` on unchanged: the engine behind it checks
it in its turn.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import urlsplit

__all__ = ["parse_origin", "refusal"]

_DEFAULT_PORT = {"http": 80, "https": 443}


def parse_origin(text: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin (``http://127.0.0.1:8188``; the host lower-case,
    without brackets; the scheme's default port filled in), or ``None`` for anything that is
    not an http(s) origin (``null``, a path, user info, a bad port)."""
    try:
        u = urlsplit(text.strip().rstrip("/"))
        port = u.port
    except ValueError:
        return None
    scheme = u.scheme.lower()
    if scheme not in _DEFAULT_PORT or not u.hostname or u.path or u.query or u.fragment \
            or u.username is not None or u.password is not None:
        return None
    return scheme, u.hostname.lower(), port if port is not None else _DEFAULT_PORT[scheme]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_ip(host: str, local: str) -> bool:
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(local.split("%")[0])
    except ValueError:
        return False


def refusal(origin: str | None, sockname, allowed: Iterable[str] = ()) -> str | None:
    """Why a request with ``Origin: origin`` is refused, or ``None`` when it passes (see the
    module docstring). ``sockname``: the listening side of the connection (the transport's
    ``sockname``, ``(host, port, ...)``); ``allowed``: the configured origins."""
    if origin is None:
        return None
    o = parse_origin(origin)
    if o is None:
        return f"Origin {origin[:100]!r} is not an http(s) origin"
    if o in {parse_origin(a) for a in allowed}:
        return None
    if isinstance(sockname, (tuple, list)) and len(sockname) >= 2:
        local_host, local_port = str(sockname[0]), sockname[1]
        if o[2] == local_port and (_loopback(o[1]) or _same_ip(o[1], local_host)):
            return None
    return (f"Origin {origin[:100]!r} is neither this machine's own page (loopback or this "
            f"listener's address, on its port) nor one of [listeners] origins")
