"""``berth supervisor listen``: the eventlistener that supervisord starts.

Source: issue 7; reference/hosts.md "Eventlistener protocol", "Pitfalls". In supervisord.conf::

    [eventlistener:berth]
    command=berth supervisor listen --config /etc/berth/berth.toml
    events=PROCESS_STATE,TICK_5
    buffer_size=100

Start-up, in order:

1. guard standard output (:func:`~berth_hosts.supervisor.protocol.guard_stdout`) before
   anything else runs, so nothing but the protocol ever reaches supervisord;
2. read berth.toml, load the plugins and hand them the config (exit 2 on an error in any of
   them: supervisord backs off and marks it FATAL, which ``supervisorctl status`` shows);
3. start the asyncio side (:class:`~berth_hosts.supervisor.listener.Host`) in a thread;
4. run the protocol in the main thread: ``READY``, read an event, hand it over, ``RESULT 2 OK``
   at once; the slow work (berthd calls, ``startProcess``/``stopProcess``) runs on the other
   side, so supervisord, which is single-threaded, never waits on Berth.

Exit status: 0 when supervisord closes the stream, 2 for a config error, 3 on a protocol desync
(a header that does not parse, a payload cut short) and 4 if the asyncio side died; supervisord
then restarts the listener (``autorestart=true``), which finds its leases again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading

from berth import paths
from berth.config import ConfigError, load_config

from berth_plugins.manager import make_plugin_manager

__all__ = ["arguments", "listen"]

log = logging.getLogger("berth.hosts.supervisor")
MAPPING_FILE = "supervisor-listener.json"


class _Side(threading.Thread):
    """The asyncio side in its own thread: builds the :class:`Host` and runs it."""

    def __init__(self, cfg, pm, sup):
        super().__init__(name="berth-supervisor-host", daemon=True)
        self.cfg, self.pm, self.sup = cfg, pm, sup
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.host = None
        self.started_ok = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:           # reported by the protocol loop, which exits
            self.error = e
            log.exception("the listener's asyncio side failed")
        finally:
            self.started_ok.set()

    async def _main(self) -> None:
        from berth.client import Client

        from .listener import Host
        self.loop = asyncio.get_running_loop()
        stop = self.stop_event = asyncio.Event()
        async with Client(socket=paths.socket_path(self.cfg)) as client:
            self.host = Host(self.cfg, self.sup, client, self.pm,
                             paths.state_dir(self.cfg) / MAPPING_FILE)
            self.started_ok.set()
            await self.host.run(stop)

    def deliver(self, ev) -> None:
        self.loop.call_soon_threadsafe(self.host.on_event, ev)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Let the asyncio side take in what was delivered, then end it (seconds)."""
        if self.is_alive() and self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.join(timeout_s)


def _is_self(ev, me: str | None) -> bool:
    return me is not None and ev.fields.get("processname") == me


def listen(config_path: str | None, proto_fd: int, stdin=None) -> int:
    """Run the listener until supervisord closes stdin. ``proto_fd`` is the guarded protocol
    descriptor. Returns the exit status (see the module docstring)."""
    from .protocol import Protocol, ProtocolError, text_stdin
    from .rpc import Endpoint, Supervisor

    try:
        cfg, path = load_config(config_path)
        sup = Supervisor(Endpoint.from_config(cfg))
    except (ConfigError, ValueError) as e:
        log.error("the listener cannot start: %s", e)
        return 2
    if not any(e.supervisor for e in cfg.engines.values()):
        log.warning("%s names no supervisord program (engines.X.supervisor); nothing to do",
                    path or "the default config")
    try:
        pm = make_plugin_manager()
        pm.hook.berth_configure(config=cfg)
    except Exception as e:                 # a plugin refused to load, or refused the config
        log.error("the listener cannot start: a plugin failed: %s: %s", type(e).__name__, e)
        return 2
    side = _Side(cfg, pm, sup)
    side.start()
    side.started_ok.wait()
    if side.error is not None or side.host is None:
        return 4
    me = os.environ.get("SUPERVISOR_PROCESS_NAME")
    proto = Protocol(stdin if stdin is not None else text_stdin(), proto_fd)
    log.info("listening for supervisord events (programs: %s)",
             ", ".join(f"{p.name}={p.engine} ({p.mode})" for p in side.host.programs.values())
             or "none")
    while True:
        proto.ready()
        try:
            ev = proto.read_event()
        except (ProtocolError, UnicodeDecodeError) as e:
            log.error("protocol desync, exiting so that supervisord restarts the listener: %s", e)
            return 3
        if ev is None:
            log.info("supervisord closed the event stream; exiting")
            side.stop()
            return 0
        if not side.is_alive():
            log.error("the listener's asyncio side is gone; exiting to be restarted")
            return 4
        if not _is_self(ev, me):
            side.deliver(ev)
        proto.ok()


def _cmd_listen(args) -> int:
    from .protocol import guard_stdout
    proto_fd = guard_stdout()              # (1) before anything can print
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s berth supervisor %(levelname)s: %(message)s")
    return listen(args.config, proto_fd)


def arguments(p) -> None:
    """Fill ``berth supervisor``'s parser (:data:`berth.cli.COMMANDS`)."""
    psub = p.add_subparsers(dest="supervisor_command", metavar="ACTION", required=True)
    lp = psub.add_parser("listen", help="the eventlistener supervisord runs "
                                        "(events=PROCESS_STATE,TICK_5)",
                         description=__doc__.split("\n\n")[0].replace("``", ""))
    lp.add_argument("--config", help=f"berth.toml (default: {paths.CONFIG_PLACES})")
    lp.add_argument("-v", "--verbose", action="store_true")
    lp.set_defaults(func=_cmd_listen)
