"""``berth gateway [--listen ADDR] [--comfyui-listen ADDR] [--config PATH]`` (issue 14)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

__all__ = ["register"]

DEFAULT_LISTEN = "127.0.0.1:7880"


def register(sub) -> None:
    p = sub.add_parser("gateway", help="one endpoint for every engine (routing by model, peers)",
                       description="Route the OpenAI routes by `model` to the front of the engine "
                                   "that serves it (here or on a peer), and ComfyUI's API to the "
                                   "comfyui entry.")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where clients reach the gateway (default {DEFAULT_LISTEN})")
    p.add_argument("--comfyui-listen", metavar="HOST:PORT",
                   help="also front ComfyUI's whole surface (web UI, API, /ws) here")
    p.add_argument("--config", help="berth.toml (default: $BERTH_CONFIG or the usual place)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from berth import paths
    from berth.config import Config, ConfigError, load
    path = Path(args.config) if args.config else paths.config_path()
    try:
        cfg = load(path) if path.exists() else Config()
    except ConfigError as e:
        print(f"berth gateway: {e}", file=sys.stderr)
        return 2
    if args.config and not path.exists():
        print(f"berth gateway: --config: no file {path}", file=sys.stderr)
        return 2
    from berth.gateway.server import Gateway
    try:
        gw = Gateway(cfg, args.listen, args.comfyui_listen)
    except ValueError as e:
        print(f"berth gateway: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(gw))


def _warn_exposed(gw) -> None:
    """A warning for a listener other machines can reach (issue 26)."""
    from berth.exposed import warn_if_exposed
    log = logging.getLogger("berth.gateway")
    what = "they send requests to every model routed here, without authentication"
    warn_if_exposed(log, "berth gateway --listen", f"{gw.host}:{gw.port}", what)
    if gw.comfy:
        warn_if_exposed(log, "berth gateway --comfyui-listen", f"{gw.comfy.host}:{gw.comfy.port}",
                        "they use ComfyUI's whole surface, without authentication")


async def _serve(gw) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await gw.start()
    except OSError as e:
        print(f"berth gateway: cannot listen: {e.strerror or e}", file=sys.stderr)
        await gw.stop()
        return 1
    comfy = f", ComfyUI port on {gw.comfy.host}:{gw.comfy.port}" if gw.comfy else ""
    peers = f", {len(gw.peers.peers)} peer(s)" if gw.peers else ""
    print(f"berth gateway: {gw.machine} on http://{gw.host}:{gw.port}{comfy}{peers}", flush=True)
    _warn_exposed(gw)
    await stop.wait()
    await gw.stop()
    return 0
