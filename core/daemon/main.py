"""``berth daemon`` (also ``berthd``) and ``berth config check``.

Source: issue 4 "Running it"; issue 11 "Lifetimes you can see". One berthd per machine owns
every card of its driver (seed 002 stage B). Start-up, in order, each step on one
:class:`contextlib.AsyncExitStack` so that a later step's failure undoes the earlier ones in
reverse and a failed start leaves nothing behind (and says why in one line):

1. read and validate the config (every error listed by key path, then exit 2);
2. load the plugins (a misspelled or mistyped plugin stops the daemon here), check that every
   configured ``park``/``adapter``/``supervisor`` has a plugin carrying it out, and hand them
   the config (``berth_configure``; a plugin that refuses it stops the daemon too) - exit 2;
3. make sure no other berthd answers on the control socket, before anything is written - exit 4;
4. hold ``<state dir>/berthd.lock`` (one berthd per state directory) - exit 4;
5. open the driver (NVML, or the simulated cards declared in the config) - exit 3;
6. start the broker: restore the state file, re-attach live leases, measure baselines;
7. serve the control API on the Unix socket (``[api] socket_mode``, default 0660, and
   ``[api] socket_group``: a group that does not exist, or one berthd's user may not give the
   socket to, stops the start at step 2 with exit 2) - exit 4 if it cannot be bound, and on
   ``[api] tcp`` when set - exit 2 if that cannot listen (its port already in use, say: one line
   naming the key and the address, as ``berth run --front`` and ``berth gateway --listen``);
8. serve the web board on ``[board] listen`` (default ``127.0.0.1:7088``; a port already taken
   is logged and berthd runs on without the board).

SIGTERM, SIGINT or SIGHUP (its terminal closed) stops it in reverse: the long polls end, the API
closes, the broker writes the state file, the driver closes, the lock is released; the log says
which signal. Leases survive: their runs keep serving (they fail open) and re-attach when berthd
is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from berth import paths, startup
from berth.config import Config, ConfigError, load, load_config, plugin_problems, summary
from berth.driver.base import Driver, DriverError

from berth_plugins.manager import PluginRefused, adapters, make_plugin_manager, mechanisms

if TYPE_CHECKING:
    from berth.daemon.broker import Broker

__all__ = ["daemon_arguments", "config_arguments", "open_driver", "main_async", "StartRefused"]

log = logging.getLogger("berth.daemon")


class StartRefused(Exception):
    """berthd cannot start: ``str()`` is the one line for the user, ``code`` the exit status."""

    def __init__(self, message: str, code: int, problems: list[tuple[str, str]] = ()):
        super().__init__(message)
        self.code, self.problems = code, list(problems)


def open_driver(cfg: Config) -> Driver:
    """The configured driver. Simulated cards are declared (idempotently) first.
    Raises :class:`DriverError` (no NVIDIA driver, a sim directory declared differently)."""
    if cfg.driver.kind == "sim":
        from berth.sim.cards import CardSpec, SimCards, SimError
        from berth.sim.driver import SimDriver
        specs = [CardSpec.make(c.name, c.total, pci=c.pci, baseline_bytes=c.baseline, index=i,
                               model=c.model)
                 for i, c in enumerate(cfg.driver.cards)]
        d = paths.sim_dir(cfg)
        try:
            SimCards.init(d, specs, free_delay_s=cfg.driver.free_delay,
                          restore_bytes_per_s=cfg.driver.checkpoint_rate)
        except SimError as e:
            raise DriverError(str(e)) from None
        return SimDriver(d, list_exited=cfg.driver.list_exited)
    from berth.driver.nvml import NvmlDriver
    return NvmlDriver(proc_root=cfg.driver.proc_root)


def load_plugins(cfg: Config):
    """The checked plugin manager, configured with ``cfg``. Raises :class:`StartRefused`
    (code 2) for a plugin refused at registration, an engine whose park, adapter or supervisor
    program no plugin carries out, or a plugin that refuses the config."""
    try:
        pm = make_plugin_manager()
    except (PluginRefused, ValueError) as e:
        raise StartRefused(f"a plugin cannot be loaded: {e}", 2) from None
    problems = plugin_problems(cfg, mechanisms(pm), adapters(pm))
    if problems:
        raise StartRefused("the config names what no plugin carries out: " + "; ".join(
            f"{k}: {m}" for k, m in problems), 2, problems)
    try:
        pm.hook.berth_configure(config=cfg)
    except Exception as e:          # a plugin refused the config: say which and why
        raise StartRefused(f"a plugin cannot use this config: {type(e).__name__}: {e}", 2) from None
    return pm


def socket_gid(cfg: Config) -> int | None:
    """The group id of ``[api] socket_group`` (``None`` when unset). Raises
    :class:`StartRefused` (code 2), one line naming the group, when no such group exists or
    berthd's user (not root) is not in it: chown would refuse to give it the socket."""
    import grp
    name = cfg.api.socket_group
    if not name:
        return None
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise StartRefused(f"[api] socket_group {name!r}: no such group; create it "
                           f"(groupadd {name}) or leave socket_group out", 2) from None
    if os.geteuid() != 0 and gid not in (os.getegid(), *os.getgroups()):
        raise StartRefused(f"[api] socket_group {name!r}: berthd's user is not a member, so it "
                           f"cannot give the socket to that group (usermod -aG {name} USER, "
                           f"then log in again), or run berthd as root", 2)
    return gid


def _socket_access(sock: Path, mode: int, gid: int | None, group: str | None) -> None:
    """Give the control socket its mode and group, and say when the group cannot reach it: a
    directory on the way that the group may not search (the state directory is berthd's
    choice of mode; /run/berth as berthd makes it is searchable)."""
    if gid is not None:
        os.chown(sock, -1, gid)
    os.chmod(sock, mode)
    if gid is None:
        return
    for d in sock.parents:
        st = d.stat()
        if not st.st_mode & 0o001 and not (st.st_gid == gid and st.st_mode & 0o010):
            log.warning("[api] socket_group %r cannot reach %s: %s (mode %04o) is closed to "
                        "it; chgrp %s %s and chmod g+x, or move [api] socket", group, sock, d,
                        st.st_mode & 0o7777, group, d)
            break


async def _start(stack: contextlib.AsyncExitStack, cfg: Config):
    """Acquire berthd's parts in order on ``stack`` (see the module docstring); the broker."""
    # berthd's own parts load only when it runs (`berth config check` needs none of them).
    from berth.daemon.broker import Broker
    pm = load_plugins(cfg)
    gid = socket_gid(cfg)
    from berth.daemon.guard import raise_fd_limit
    before, after = raise_fd_limit()            # a flood must not starve the socket (issue 36)
    if after != before:
        log.info("descriptor limit raised from %d to %d (its hard limit)", before, after)
    sock = paths.socket_path(cfg)
    if _answers(sock):
        raise StartRefused(f"another berthd answers on {sock}; stop it first, or give this one "
                           f"its own socket and state_dir", 4)
    sdir = paths.state_dir(cfg)
    stack.enter_context(_lock(sdir))
    try:
        driver = open_driver(cfg)
        stack.callback(driver.close)
        driver.cards()
    except DriverError as e:
        raise StartRefused(str(e), 3) from None
    broker = await _start_broker(stack, cfg, Broker(cfg, driver, sdir / "state.toml", pm))
    await _serve(stack, cfg, broker, sock, gid)
    cards = ", ".join(f"{c.name}={c.pci}" for c in broker.sched.ledger.cards.values())
    log.info("berthd ready on %s (driver %s: %s); restored %d lease(s), dropped %d",
             sock, driver.kind, cards, len(broker.restored), len(broker.dropped))
    if broker.quarantined:
        log.error("the state file was corrupt and was moved to %s", broker.quarantined)
    return broker


async def _start_broker(stack: contextlib.AsyncExitStack, cfg: Config, broker: "Broker"):
    """Step 6: the broker's host RAM budget (bytes), then its start on ``stack`` (state file,
    re-attached leases, baselines). Raises :class:`StartRefused` (code 3) on a driver error."""
    if cfg.policy.ram_budget == "auto":
        available = cfg.driver.host_ram or psutil.virtual_memory().available
        broker.sched.ledger.ram_budget_bytes = int(available * 0.8)
    else:
        broker.sched.ledger.ram_budget_bytes = cfg.policy.ram_budget
    broker.sim_dir = str(paths.sim_dir(cfg)) if cfg.driver.kind == "sim" else None
    try:
        await broker.start()
    except DriverError as e:
        raise StartRefused(str(e), 3) from None
    stack.push_async_callback(broker.stop)
    await broker.resume_restored()
    return broker


async def _serve(stack: contextlib.AsyncExitStack, cfg: Config, broker: "Broker", sock: Path,
                 gid: int | None) -> None:
    """Steps 7 and 8 on ``stack``: the control API on ``sock`` (group ``gid``), then the web
    board. Raises :class:`StartRefused` when the API cannot listen: code 4 on its socket, 2 on
    ``[api] tcp``."""
    from berth.daemon import board_web as board
    from berth.daemon.api_serve import serve
    hub = board.Hub(board.BrokerSource(broker), pages=bool(cfg.board.listen))
    from berth.exposed import CannotListen
    try:
        runner = await serve(broker, sock, cfg.api.tcp, cfg.api.key, waits=hub.waits)
    except CannotListen as e:
        # A config value that cannot be used, as at step 1 (and as berth run's --front): 2.
        raise StartRefused(str(e), 2) from None
    except OSError as e:
        raise StartRefused(f"the control API cannot listen: {e}", 4) from None
    stack.push_async_callback(runner.cleanup)
    _socket_access(sock, cfg.api.socket_mode, gid, cfg.api.socket_group)
    stack.callback(broker.begin_shutdown)         # long polls end before the API closes
    await hub.start()
    if cfg.board.listen:                          # the web board (issue 15); a busy port is logged
        li = cfg.listeners
        board_runner = await board.serve(
            hub, cfg.board.listen, cfg.board.key,
            board.Limits(li.head_timeout, li.idle_timeout, li.max_connections or None),
            cfg.board.session_limit)
        if board_runner is not None:
            stack.push_async_callback(board_runner.cleanup)
    _warn_exposed(cfg)
    stack.push_async_callback(hub.stop)           # its streams end before the board closes


def _warn_exposed(cfg: Config) -> None:
    """A warning for each listener other machines can reach (issue 26)."""
    from berth.exposed import warn_if_exposed
    if cfg.board.listen:
        warn_if_exposed(log, "[board] listen", cfg.board.listen,
                        "anyone there sees every engine, lease and card, and with the board's "
                        "key (sent over plain HTTP) acts as an operator")
    if cfg.api.tcp:
        warn_if_exposed(log, "[api] tcp", cfg.api.tcp,
                        "anyone there with the key (sent over plain HTTP) may lease, park, wake "
                        "and drain as an operator")


#: The signals that stop berthd in order. SIGHUP too: a berthd started from a terminal gets it
#: when the terminal closes, and its default action killed berthd with no orderly stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stop_on(sig: signal.Signals, got: list[signal.Signals], stop: asyncio.Event) -> None:
    got.append(sig)    # the first one names the stop in the log
    stop.set()


async def main_async(cfg: Config, ready: asyncio.Event | None = None) -> int:
    """Run berthd until SIGTERM, SIGINT or SIGHUP (:data:`STOP_SIGNALS`); the exit status (0,
    or a :class:`StartRefused` code after logging its one line)."""
    try:
        async with contextlib.AsyncExitStack() as stack:
            await _start(stack, cfg)
            startup.started()                   # its modules are loaded: collect again
            stop = asyncio.Event()
            got: list[signal.Signals] = []
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, _stop_on, sig, got, stop)
                stack.callback(loop.remove_signal_handler, sig)
            if ready is not None:
                ready.set()
            await stop.wait()
            log.info("berthd stopping (%s)", got[0].name)
    except StartRefused as e:
        log.error("%s", e)
        return e.code
    return 0


def _answers(sock: Path) -> bool:
    """Does a process accept connections on the Unix socket ``sock``? (Connects, sends nothing.)"""
    import socket
    if not sock.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(sock))
            return True
        except OSError:
            return False


@contextlib.contextmanager
def _lock(sdir: Path):
    """Hold ``<state dir>/berthd.lock`` for the daemon's life: one berthd per state directory
    (two would each believe they own the cards and the socket). Raises :class:`StartRefused`
    (code 4) if another holds it, without writing to it. A state directory this start made is
    removed again if the start fails."""
    try:
        made = paths.prepare_state_dir(sdir)
        path = sdir / "berthd.lock"
        f = os.fdopen(paths.open_lock(path), "r+")
    except paths.UnsafePath as e:
        raise StartRefused(str(e), 4) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        other = f.read().strip() or "?"
        f.close()
        raise StartRefused(f"another berthd (pid {other}) already serves {sdir}; stop it first, "
                           f"or give this one its own state_dir", 4) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    try:
        yield f
    except BaseException:
        if made:                    # nothing of a failed first start stays behind
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                sdir.rmdir()
        raise
    finally:
        f.close()


def _cmd_daemon(args) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s berthd %(levelname)s %(name)s: %(message)s")
    try:
        cfg, path = load_config(args.config)
    except ConfigError as e:
        print(f"berthd: {e}", file=sys.stderr)
        return 2
    return asyncio.run(main_async(cfg))


def _cmd_config_check(args) -> int:
    """``berth config check [PATH]``: the file named, else the one berthd would read
    (:func:`berth.paths.find_config`); with none there, what the defaults mean. On NVML, the
    cards it names are checked against NVML's (:func:`_check_cards`)."""
    try:
        path = args.path or paths.find_config()
        cfg = load(path) if path is not None else Config()
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    name = str(path) if path is not None else str(paths.config_path())
    try:
        load_plugins(cfg)
        socket_gid(cfg)
        _check_cards(cfg, name)
    except StartRefused as e:
        print(str(ConfigError(name, e.problems)) if e.problems else f"{name}: {e}",
              file=sys.stderr)
        return e.code
    if path is None:
        print(f"{name}: no such file; berthd runs on the defaults\n{summary(cfg)}")
    else:
        print(f"{name}: valid\n{summary(cfg)}")
    return 0


def _check_cards(cfg: Config, name: str) -> None:
    """The cards the config names against the cards NVML sees (a simulated card is checked
    with the config's own values, :mod:`berth.config.cross`). Raises :class:`StartRefused`
    (code 2) naming each key and value no card answers to. Where NVML cannot be read (no
    NVIDIA driver here), each is named in a warning on stderr: an unknown card passed the
    check silently."""
    from berth.config import card_problems, named_cards
    named = named_cards(cfg)
    if cfg.driver.kind != "nvml" or not named:
        return
    try:
        driver = open_driver(cfg)
        try:
            seen = [(info.pci, f"gpu{i}") for i, info in enumerate(driver.cards())]
        finally:
            driver.close()
    except DriverError as e:
        from berth.driver.nvml import NO_DRIVER_HINT
        why = str(e).removesuffix(NO_DRIVER_HINT).strip()
        for key, card in named:
            what = f"[{key}]" if key.startswith("cards.") else f"{key} = {card!r}"
            print(f"{name}: warning: {what} could not be checked against the driver's cards: "
                  f"{why}", file=sys.stderr)
        return
    problems = card_problems(cfg, seen, "NVML")
    if problems:
        raise StartRefused("; ".join(f"{k}: {m}" for k, m in problems), 2, problems)


def daemon_arguments(p) -> None:
    """Fill ``berth daemon``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.add_argument("--config", metavar="PATH",
                   help=f"berth.toml (default: {paths.CONFIG_PLACES}; none there: the defaults)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.epilog = ("exit codes: 0 on SIGTERM, SIGINT or SIGHUP; 2 for a config that cannot be "
                "used, [api] tcp that cannot listen included (another process listens on its "
                "port), as berth run's --front; 3 when the driver cannot be opened; 4 when "
                "another berthd answers on the socket or holds the state directory, or the "
                "socket cannot be bound")
    p.set_defaults(func=_cmd_daemon)
    startup.keep_paused(p)          # berthd says started() once ready (main_async)


def config_arguments(c) -> None:
    """Fill ``berth config``'s parser (:data:`berth.cli.COMMANDS`)."""
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    chk = csub.add_parser("check", help="validate a config and explain what it means")
    chk.description = (f"Validate a berth.toml and say what it means. Without PATH: the one "
                       f"berthd reads ({paths.CONFIG_PLACES}; here {paths.config_path()}).")
    chk.add_argument("path", nargs="?", metavar="PATH",
                     help=f"the file (default: the one berthd reads: {paths.CONFIG_PLACES})")
    chk.set_defaults(func=_cmd_config_check)
    startup.keep_paused(chk)        # one check, then it exits
