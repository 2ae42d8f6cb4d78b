"""``berth daemon`` (also ``berthd``) and ``berth config check``.

Source: issue 4 "Running it". One berthd per machine owns every card of its driver (seed 002
stage B). Start-up, in order:

1. read and validate the config (every error listed by key path, then exit 2);
2. open the driver (NVML, or the simulated cards declared in the config);
3. load the plugins (a misspelled or mistyped plugin stops the daemon here) and hand them the
   config (``berth_configure``; a plugin that refuses it stops the daemon too);
4. restore the state file, re-attach live leases, measure baselines;
5. serve the control API on the Unix socket (mode 0660).

SIGTERM or SIGINT stops it: the API closes, the state file is written. Leases survive: their
runs keep serving (they fail open) and re-attach when berthd is back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import psutil

from berth import paths
from berth.config import Config, ConfigError, load, summary
from berth.driver.base import Driver, DriverError

__all__ = ["register", "load_config", "open_driver", "main_async"]

log = logging.getLogger("berth.daemon")


def load_config(path: str | None) -> tuple[Config, Path | None]:
    """The config at ``path``, else ``$BERTH_CONFIG``, else the default location; with no file
    at the default location, the defaults (NVML). Raises :class:`ConfigError`."""
    if path:
        return load(path), Path(path)
    p = paths.config_path()
    if p.exists():
        return load(p), p
    if os.environ.get("BERTH_CONFIG"):
        return load(p), p          # named but missing: say so
    return Config(), None


def state_dir_of(cfg: Config) -> Path:
    return paths.state_dir(cfg)


def sim_dir_of(cfg: Config) -> Path:
    return paths.sim_dir(cfg)


def open_driver(cfg: Config) -> Driver:
    """The configured driver. Simulated cards are declared (idempotently) first.
    Raises :class:`DriverError` (no NVIDIA driver, a sim directory declared differently)."""
    if cfg.driver.kind == "sim":
        from berth.driver.sim import SimDriver
        from berth.sim.cards import CardSpec, SimCards, SimError
        specs = [CardSpec.make(c.name, c.total, pci=c.pci, baseline_bytes=c.baseline, index=i)
                 for i, c in enumerate(cfg.driver.cards)]
        d = sim_dir_of(cfg)
        try:
            SimCards.init(d, specs, free_delay_s=cfg.driver.free_delay,
                          restore_bytes_per_s=cfg.driver.checkpoint_rate)
        except SimError as e:
            raise DriverError(str(e)) from None
        return SimDriver(d)
    from berth.driver.nvml import NvmlDriver
    return NvmlDriver(proc_root=cfg.driver.proc_root)


async def main_async(cfg: Config, ready: asyncio.Event | None = None) -> int:
    from berth_plugins.manager import make_plugin_manager

    from berth.daemon.api import serve
    from berth.daemon.broker import Broker
    sdir = state_dir_of(cfg)
    sdir.mkdir(parents=True, exist_ok=True)
    lock = _lock(sdir)
    if lock is None:
        return 4
    try:
        driver = open_driver(cfg)
        driver.cards()
    except DriverError as e:
        log.error("%s", e)
        return 3
    pm = make_plugin_manager()
    try:
        pm.hook.berth_configure(config=cfg)
    except Exception as e:          # a plugin refused the config: say which and why
        log.error("a plugin cannot use this config: %s: %s", type(e).__name__, e)
        driver.close()
        return 2
    broker = Broker(cfg, driver, sdir / "state.toml", pm)
    if cfg.policy.ram_budget == "auto":
        broker.sched.ledger.ram_budget_bytes = int(psutil.virtual_memory().available * 0.8)
    else:
        broker.sched.ledger.ram_budget_bytes = cfg.policy.ram_budget
    await broker.start()
    await broker.resume_restored()
    sock = paths.socket_path(cfg)
    runner = await serve(broker, sock, cfg.api.tcp, cfg.api.key)
    broker.sim_dir = str(sim_dir_of(cfg)) if cfg.driver.kind == "sim" else None
    cards = ", ".join(f"{c.name}={c.pci}" for c in broker.sched.ledger.cards.values())
    log.info("berthd ready on %s (driver %s: %s); restored %d lease(s), dropped %d",
             sock, driver.kind, cards, len(broker.restored), len(broker.dropped))
    if broker.quarantined:
        log.error("the state file was corrupt and was moved to %s", broker.quarantined)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("berthd stopping")
    broker.begin_shutdown()
    await runner.cleanup()
    await broker.stop()
    driver.close()
    return 0


def _lock(sdir: Path):
    """Hold ``<state dir>/berthd.lock`` for the daemon's life: one berthd per state directory
    (two would each believe they own the cards and the socket). ``None`` if another holds it."""
    import fcntl
    f = open(sdir / "berthd.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        other = f.read().strip() or "?"
        log.error("another berthd (pid %s) already serves %s; stop it first, or give this one "
                  "its own state_dir", other, sdir)
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _cmd_daemon(args) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s berthd %(levelname)s %(name)s: %(message)s")
    try:
        cfg, path = load_config(args.config)
    except ConfigError as e:
        print(f"berthd: the config cannot be used.\n{e}", file=sys.stderr)
        return 2
    return asyncio.run(main_async(cfg))


def _cmd_config_check(args) -> int:
    try:
        cfg = load(args.path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"{args.path}: valid\n{summary(cfg)}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("daemon", help="run berthd, the broker for every card of this machine")
    p.add_argument("--config", help="berth.toml (default $BERTH_CONFIG or the usual place)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=_cmd_daemon)
    c = sub.add_parser("config", help="check a berth.toml")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    chk = csub.add_parser("check", help="validate a config and explain what it means")
    chk.add_argument("path")
    chk.set_defaults(func=_cmd_config_check)
