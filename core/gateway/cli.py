"""``berth gateway [--listen ADDR] [--comfyui-listen ADDR] [--config PATH]`` (issue 14)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from berth import startup

__all__ = ["arguments"]

DEFAULT_LISTEN = "127.0.0.1:7880"


def arguments(p) -> None:
    """Fill ``berth gateway``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.description = ("Route the OpenAI routes by `model` to the front of the engine that serves "
                     "it (here or on a peer), and ComfyUI's API to the comfyui entry.")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where clients reach the gateway (default {DEFAULT_LISTEN})")
    p.add_argument("--comfyui-listen", metavar="HOST:PORT",
                   help="also front ComfyUI's whole surface (web UI, API, /ws) here")
    p.add_argument("--config", help="berth.toml (default: $BERTH_CONFIG or the usual place)")
    p.epilog = ("exit codes: 0 on SIGTERM, SIGINT or SIGHUP; 2 for bad input or an address "
                "that cannot listen (another process listens on the port of --listen or "
                "--comfyui-listen), as berth run's --front")
    p.set_defaults(func=_main)
    startup.keep_paused(p)          # the gateway says started() once it listens


def _main(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from berth.config import ConfigError, load_config
    try:
        cfg, _ = load_config(args.config)
    except ConfigError as e:
        print(f"berth gateway: {e}", file=sys.stderr)
        return 2
    from berth.gateway.server import Gateway
    try:
        gw = Gateway(cfg, args.listen, args.comfyui_listen)
    except ValueError as e:
        print(f"berth gateway: {e}", file=sys.stderr)
        return 2
    return run(_serve(gw))


def run(main) -> int:
    """Run ``main`` on uvloop where it is installed (measured by ``bench/gateway.py``: the
    gateway's hop costs 0.1 to 0.2 ms less per request at concurrency 1, and less CPU), else on
    asyncio's own loop. The listener is the same code on both."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def start_line(gw) -> str:
    """``berth gateway: listening on http://HOST:PORT (models: a, b)`` and what else runs."""
    names = sorted({r.name for r in gw.table.routes} |
                   {r.name for p in (gw.peers.peers if gw.peers else ()) for r in p.routes})
    comfy = f"; ComfyUI port on http://{gw.comfy.host}:{gw.comfy.port}" if gw.comfy else ""
    peers = f"; {len(gw.peers.peers)} peer(s)" if gw.peers else ""
    return (f"berth gateway: listening on http://{gw.host}:{gw.port} "
            f"(models: {', '.join(names) or 'none yet'}){comfy}{peers}")


def _warn_exposed(gw) -> None:
    """A warning for a listener other machines can reach (issue 26)."""
    from berth.exposed import warn_if_exposed
    log = logging.getLogger("berth.gateway")
    what = "they send requests to every model routed here, without authentication"
    warn_if_exposed(log, "berth gateway --listen", f"{gw.host}:{gw.port}", what)
    if gw.comfy:
        warn_if_exposed(log, "berth gateway --comfyui-listen", f"{gw.comfy.host}:{gw.comfy.port}",
                        "they use ComfyUI's whole surface, without authentication")


#: The signals that stop the gateway in order (its listeners closed, requests in flight given up
#: to 2 s, then what it built stopped in reverse), exit 0. SIGHUP too: a gateway started from a
#: terminal gets it when the terminal closes, and its default action killed the gateway at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stop_on(sig: signal.Signals, got: list[signal.Signals], stop: asyncio.Event) -> None:
    got.append(sig)    # the first one names the stop
    stop.set()


async def _serve(gw) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP (:data:`STOP_SIGNALS`), then stop in order and say
    which signal; 0, or 2 where it cannot listen (the code of bad input, as for berth run's
    --front)."""
    from berth.exposed import CannotListen
    stop = asyncio.Event()
    got: list[signal.Signals] = []
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _stop_on, sig, got, stop)
    try:
        await gw.start()
    except OSError as e:
        print(f"berth gateway: {e if isinstance(e, CannotListen) else e.strerror or e}",
              file=sys.stderr)
        return 2
    startup.started()                   # its modules are loaded: collect again
    print(start_line(gw), flush=True)
    _warn_exposed(gw)
    try:
        await stop.wait()
        print(f"berth gateway: stopping ({got[0].name})", flush=True)
    finally:
        await gw.stop()
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    return 0
