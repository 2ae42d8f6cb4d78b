"""The web board (issue 15): who holds what on which card, what is parked in host RAM, who waits
and why, the last events, and an hour of history, live in a browser over server-sent events.

Plain HTML, CSS and JavaScript shipped in ``static/`` (no build step, nothing fetched from
elsewhere: the page works offline). berthd serves it on ``[board] listen`` (default
``127.0.0.1:7088``) with :func:`serve`; the gateway mounts it from its own process with::

    from berth.daemon.board_web import Hub, SocketSource, board_app
    hub = Hub(SocketSource(socket_path)); await hub.start()
    app.add_subapp("/board/", board_app(hub, cfg.board.key))      # and await hub.stop() at the end
"""

from __future__ import annotations

import logging

from aiohttp import web
from berth.daemon.board_web.app import CSP, OPS, board_app, operator_of
from berth.daemon.board_web.hub import BrokerSource, Hub, SocketSource, WaitTimes
from berth.daemon.board_web.listen import GuardedSite, Limits

__all__ = ["Hub", "BrokerSource", "SocketSource", "WaitTimes", "board_app", "operator_of",
           "serve", "CSP", "OPS", "Limits"]

log = logging.getLogger("berth.daemon.board_web")


async def serve(hub: Hub, listen: str, key: str | None, limits: Limits | None = None,
                session_s: float = 8 * 3600.0) -> web.AppRunner | None:
    """Serve the board on ``listen`` (``HOST:PORT``), its clients under ``limits`` (a slow
    request head, an idle connection, too many connections: :mod:`.listen`); an operator's
    sign-in lasts ``session_s`` seconds. A port already taken is logged and the board is left
    out (``None``): berthd's job does not depend on its page."""
    runner = web.AppRunner(board_app(hub, key, session_s), access_log=None,
                           handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    try:
        await GuardedSite(runner, host or "127.0.0.1", int(port), limits or Limits(),
                          handler_args={"access_log": None}).start()
    except OSError as e:
        log.warning("the board cannot listen on %s (%s); berthd runs on without it "
                    "(set [board] listen to another HOST:PORT, or \"off\")", listen, e)
        await runner.cleanup()
        return None
    log.info("board on http://%s/ (%s)", listen,
             "operator actions with the key" if key else "read-only: no [board] key")
    return runner
