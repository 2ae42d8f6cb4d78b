"""berthd's control socket: the API app (:func:`berth.daemon.api.make_app`) served on a Unix
socket of mode 0660, and on TCP when ``[api] tcp`` asks, with the listeners' bounds (issue 36:
per-uid connections, head and idle times, a backlog for bursts)."""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web
from berth.daemon.api import make_app
from berth.daemon.broker import Broker

__all__ = ["serve", "CONTROL_BACKLOG"]


def _live(path: Path) -> bool:
    import socket as _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


#: Connections the kernel queues for berthd's accept: room for a burst (a flood refused at its
#: bound still passes through the queue) before a connect gets EAGAIN (issue 36).
CONTROL_BACKLOG = 1024


async def serve(broker: Broker, socket_path: Path, tcp: str | None = None,
                key: str | None = None, waits=None) -> web.AppRunner:
    """Start the API on ``socket_path`` (mode 0660) and optionally ``tcp`` (``host:port``; one
    that cannot listen raises :class:`~berth.exposed.CannotListen` naming the key).
    ``waits``: the board's :class:`~berth.daemon.board_web.WaitTimes`, for the wait-time
    histogram."""
    app = make_app(broker, key, waits)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    socket_path = Path(socket_path)
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.exists() and _live(socket_path):
        raise OSError(f"another berthd answers on {socket_path}")
    # Long polls end at once on shutdown (Broker.begin_shutdown); what is left gets 2 s. Each
    # connection is held to the listeners' head and idle times and to per-uid bounds (issue 36).
    from berth.daemon.board_web.listen import Limits
    from berth.daemon.guard import ControlBounds, GuardedUnixSite
    li = broker.cfg.listeners
    limits = Limits(li.head_timeout, li.idle_timeout, li.max_connections or None)
    site = GuardedUnixSite(runner, str(socket_path), limits, ControlBounds(limits.bound()),
                           handler_args={"access_log": None}, shutdown_timeout=2.0,
                           backlog=CONTROL_BACKLOG)
    if socket_path.exists():
        socket_path.unlink()
    await site.start()
    os.chmod(socket_path, 0o660)
    if tcp:
        host, _, port = tcp.rpartition(":")
        try:
            await web.TCPSite(runner, host or "127.0.0.1", int(port),
                              shutdown_timeout=2.0).start()
        except OSError as e:
            from berth.exposed import cannot_listen
            await runner.cleanup()      # the socket too: berthd does not start
            raise cannot_listen(f"[api] tcp = {tcp!r}", tcp, e) from None
    return runner
