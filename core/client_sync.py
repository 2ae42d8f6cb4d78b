"""berthd's errors in words, and one call to its control API with the standard library.

The short commands (``berth status``, ``berth park|wake|drain|hold|release-hold``) make one
call each and exit: :func:`call` makes it with :mod:`http.client`, so they do not import aiohttp
(its import builds two TLS contexts, the larger part of such a command's start-up CPU; issue
38). :mod:`berth.client`'s :class:`~berth.client.Client` raises the same errors, defined here,
with the same words: :class:`BerthdUnavailable` when berthd cannot be reached,
:class:`ConfigUnusable` (a kind of it) when the config that says where berthd listens does not
load, :class:`ApiError` for a 4xx/5xx answer with berthd's message.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Any

from berth import paths
from berth.config.errors import ConfigError

__all__ = ["ApiError", "BerthdUnavailable", "ConfigUnusable", "START_BERTHD", "unreachable",
           "call"]

#: How to start berthd, as every "not reachable" message ends.
START_BERTHD = "start berthd with `berthd` (the same as `berth daemon`)"


class BerthdUnavailable(ConnectionError):
    """berthd is not running or its socket cannot be reached."""


class ConfigUnusable(BerthdUnavailable):
    """berthd cannot be found: the config that says where it listens does not load.
    ``error`` is the :class:`berth.config.ConfigError`; ``str()`` names it, so a caller that
    fails open says what to fix rather than "berthd is not reachable" at a guessed socket."""

    def __init__(self, error: ConfigError):
        super().__init__(f"cannot find berthd: {error}")
        self.error = error


class ApiError(RuntimeError):
    """berthd answered with an error. ``status`` is the HTTP status, ``kind`` the error type."""

    def __init__(self, status: int, message: str, kind: str = ""):
        super().__init__(f"berthd: {message} (HTTP {status})")
        self.status, self.message, self.kind = status, message, kind


#: Why a connect failed, in words, by errno (aiohttp's own words name its internals:
#: "Cannot connect to unix socket … ssl:default [No such file or directory]").
_WHY = {
    errno.ENOENT: "no such file (berthd is not running, or it listens elsewhere: set "
                  "BERTH_SOCKET to its socket, which berthd logs at start as `berthd ready "
                  "on PATH`, in the environment of whatever starts this command, or [api] "
                  "socket in berth.toml)",
    errno.ECONNREFUSED: "connection refused (nothing listens there: berthd stopped or "
                        "never started)",
    errno.EACCES: "permission denied (your user may not use berthd's socket: join the group "
                  "berth.toml's [api] socket_group names, or ask the operator)",
    errno.ENOTSOCK: "not a socket",
    errno.ECONNRESET: "berthd closed the connection",
}
_WHY[errno.EPERM] = _WHY[errno.EACCES]


def _not_a_socket(where: str | os.PathLike | None) -> str:
    """What is at ``where`` when it is a path to something other than a socket ("regular
    file", "directory"), else ``""`` (a socket, nothing, a URL)."""
    import stat
    if where is None or str(where).startswith(("http://", "https://")):
        return ""
    try:
        mode = os.stat(where).st_mode
    except OSError:
        return ""
    if stat.S_ISSOCK(mode):
        return ""
    return "directory" if stat.S_ISDIR(mode) else "regular file" if stat.S_ISREG(mode) else "file"


def _closed(error: BaseException) -> bool:
    """Whether ``error`` says berthd closed the connection before its answer: the standard
    library's ``RemoteDisconnected`` (a ``ConnectionResetError`` with no errno) or aiohttp's
    ``ServerDisconnectedError`` (aiohttp is loaded when one was raised)."""
    aiohttp = sys.modules.get("aiohttp")
    return isinstance(error, ConnectionResetError) or (
        aiohttp is not None and isinstance(error, aiohttp.ServerDisconnectedError))


def unreachable(where: str | os.PathLike | None, error: BaseException) -> str:
    """"berthd is not reachable at WHERE: WHY; start berthd with `berthd` ...": ``where`` is
    the socket path or URL tried, ``error`` the connect's exception (aiohttp's or an
    ``OSError``); why is said from its errno, else its OS words, else its class."""
    os_error = getattr(error, "os_error", error)
    code = getattr(os_error, "errno", None)
    if code == errno.ECONNREFUSED and _not_a_socket(where):
        # Linux refuses a connect to a regular file as to a socket nobody listens on.
        why = (f"not a socket (a {_not_a_socket(where)} is there: $BERTH_SOCKET or berth.toml's "
               f"[api] socket names the wrong path)")
    elif code in _WHY:
        why = _WHY[code]
    elif _closed(error):
        why = _WHY[errno.ECONNRESET]
    else:
        why = (getattr(os_error, "strerror", None) or type(error).__name__).lower()
    return f"berthd is not reachable at {where}: {why}; {START_BERTHD}"


def _socket() -> str:
    """berthd's socket as :class:`berth.client.Client` finds and checks it."""
    try:
        sock = paths.client_socket()
    except ConfigError as e:
        raise ConfigUnusable(e) from None
    try:
        paths.check_socket(sock)                 # never talk to another user's socket
    except paths.UnsafePath as e:
        raise BerthdUnavailable(f"refusing berthd's socket: {e}") from None
    return str(sock)


def call(method: str, path: str, body: dict | None = None, timeout_s: float = 30.0) -> Any:
    """One call to berthd on its socket (found as :class:`berth.client.Client` finds it):
    ``method`` and ``path`` (``"/v1/status"``), ``body`` sent as JSON, at most ``timeout_s``
    seconds for the connect and for each read. Returns the answer's JSON (``None`` for an empty
    body). Raises :class:`ConfigUnusable`, :class:`BerthdUnavailable` (also when berthd does not
    answer within ``timeout_s``) or :class:`ApiError`, with the words the async client uses."""
    import http.client
    import socket
    sock = _socket()
    conn = http.client.HTTPConnection("berthd", timeout=timeout_s)
    try:
        conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.sock.settimeout(timeout_s)
        conn.sock.connect(sock)
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"} if data is not None else {})
        r = conn.getresponse()
        raw = r.read()
    except TimeoutError:
        raise BerthdUnavailable(f"berthd did not answer at {sock} within {timeout_s:g}s") from None
    except (OSError, http.client.HTTPException) as e:
        raise BerthdUnavailable(unreachable(sock, e)) from None
    finally:
        conn.close()
    return _answer(r.status, raw.decode("utf-8", "replace"))


def _answer(status: int, text: str) -> Any:
    """An answer's JSON as the async client reads it (``None`` for an empty body, a body that
    is not JSON as its first 500 characters), or :class:`ApiError` for a 4xx/5xx."""
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        data = {"error": {"message": text[:500]}}
    if status >= 400:
        err = (data or {}).get("error", {}) if isinstance(data, dict) else {}
        raise ApiError(status, err.get("message", str(data)), err.get("type", ""))
    return data
