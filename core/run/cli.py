"""``berth run``'s command line: the flags, their checks, and :class:`RunOptions`.

Source: issue 5; seed 002 "Fronts", rule 3. Bad input ends with exit 2 and one line naming the
flag and value, before anything starts. The run itself is :mod:`berth.run.main`, imported
only when a run starts: ``berth run --help`` and the checks load no aiohttp, pydantic or asyncio
(issue 23).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

from berth import startup
from berth.decide.model import MAX_ALIASES, Bound, ParkMechanism
from berth.decide.units import parse_duration, parse_size

__all__ = ["arguments", "RunOptions", "parse_sizes", "USAGE"]

#: The names berthd's API takes for an engine and for a model ID the gateway routes to it
#: (core/daemon/api_bodies.py LeaseBody.engine and .aliases).
_ENGINE_NAME = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")

USAGE = """\
    berth run [--engine NAME] [--front HOST:PORT] [--size SIZE[@CARD]]… [--priority N]
              [--park checkpoint|hook] [--adapter NAME] [--lend [--lend-max SIZE]] -- CMD…"""


@dataclass
class RunOptions:
    """``berth run``'s options. Durations in seconds."""

    cmd: list[str]
    engine: str
    sizes: list[tuple[str | None, str]] = field(default_factory=list)
    front: str | None = None
    upstream: str | None = None
    priority: int | None = None
    park: str | None = None
    adapter: str | None = None
    lend: bool = False
    lend_max: str | None = None
    bound: str | None = None
    health: str = "/health"
    front_health: bool = False
    # After a drain the run and its front stay, and the next write starts the engine again
    # (issue 35); ``--exit-on-drain`` opts out where a manager must see the exit.
    keep_front: bool = True
    checkpoint_path: str | None = None
    stop_grace_s: float = 1.0
    term_grace_s: float = 4.0
    release_wait_s: float = 3.0
    # None: use berthd's [policy] values (sent with the grant); 120 s / 20 s / 60 s without one.
    wait_limit_s: float | None = None
    max_in_flight: int | None = None
    release_grace_s: float | None = None
    wake_limit_s: float | None = None
    require_berthd: bool = False
    # With berthd unreachable and the engine not fitting beside what the cards hold: how long
    # the run waits for berthd before it gives up (issue 26).
    start_limit_s: float = 120.0
    options: dict = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)


def parse_sizes(values: list[str]) -> list[tuple[str | None, str]]:
    """``["10GiB@gpu0", "card"]`` -> ``[("gpu0", "10GiB"), (None, "card")]``. Raises
    ``ValueError`` naming ``--size`` and the value."""
    out = []
    for v in values:
        size, _, card = v.partition("@")
        if size.strip().isdigit() and int(size) != 0:
            # 14 read as bytes would lease nothing for an engine meant to hold 14 GiB
            raise ValueError(f"--size: {v!r} has no unit; write '{int(size)}GiB' or "
                             f"'{int(size)}MiB' (or '{int(size)}B' for bytes)")
        parse_size(size, field="--size", allow_card=True)
        if _ and not card:
            raise ValueError(f"--size: expected SIZE[@CARD], got {v!r}")
        out.append((card or None, size))
    return out


def _positive(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    v = parse_duration(text, field=flag)
    if v <= 0:
        raise ValueError(f"{flag}: must be more than 0 seconds, got {text!r}")
    return v


def _check_front(front: str) -> None:
    """``HOST:PORT`` with a port of 1–65535 (IPv6 as ``[::1]:PORT``). Raises ``ValueError``."""
    host, sep, port = front.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--front: expected HOST:PORT with a port of 1-65535, got {front!r}")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"--front: unbalanced brackets in {front!r}")


def _check_upstream(url: str) -> None:
    """An http(s) URL with a host, as the front forwards to it. Raises ``ValueError``."""
    from berth.front.upstream import Address
    try:
        Address(url)
    except ValueError:
        raise ValueError(f"--upstream: expected the engine's URL like http://127.0.0.1:8000, "
                         f"got {url!r}") from None


def _check_health(path: str) -> None:
    """A path the engine answers (``/health``) or ``none``: a path without its leading ``/``
    would never answer, and the front would stay closed. Raises ``ValueError``."""
    if path != "none" and not path.startswith("/"):
        raise ValueError(f"--health: expected a path starting with '/' like '/health', or "
                         f"'none', got {path!r}")


def _check_adapter(adapter: str) -> None:
    """The hook's adapter must be one some plugin carries out now, not at the first park (an
    unknown one would turn that park into a drain). Raises ``ValueError`` naming the adapters
    registered (group ``berth.adapters``, issue 38)."""
    from berth_plugins.manager import adapters, make_plugin_manager, mechanisms
    pm = make_plugin_manager()
    if adapter not in mechanisms(pm):
        raise ValueError(f"--adapter: no plugin carries out {adapter!r}; known adapters: "
                         f"{', '.join(adapters(pm)) or 'none'}")


def _check_checkpoint(path: str | None) -> None:
    """The cuda-checkpoint a checkpoint park will run must exist now, not at the first park
    (a missing tool would turn that park into a drain). Raises ``ValueError``."""
    tool = path or os.environ.get("BERTH_CUDA_CHECKPOINT") or "cuda-checkpoint"
    first = tool.split()[0]
    if shutil.which(first) is None:
        raise ValueError(f"--park checkpoint: cannot find {first!r} (give --checkpoint-path, set "
                         f"BERTH_CUDA_CHECKPOINT, or put NVIDIA's cuda-checkpoint on PATH; with "
                         f"simulated cards use berth-sim-cuda-checkpoint)")


def _check_aliases(aliases: list[str]) -> None:
    """``--alias``'s values as berthd's lease body takes them, said before the run asks: berthd
    refused them only once it had asked (the front up, exit 1), and a run failing open kept an
    alias no gateway could route."""
    if len(aliases) > MAX_ALIASES:
        raise ValueError(f"--alias: {len(aliases)} given; a run takes at most {MAX_ALIASES} "
                         f"model IDs besides its engine's name")
    for alias in aliases:
        if not _ENGINE_NAME.fullmatch(alias):
            raise ValueError(f"--alias: {alias!r}: a model ID has no spaces or control "
                             f"characters (1 to 200 of them)")


def _options(args, cmd: list[str]) -> RunOptions:
    """The run's options from its flags. Raises ``ValueError`` naming the flag and value."""
    if args.front:
        _check_front(args.front)
    if args.upstream:
        _check_upstream(args.upstream)
    _check_health(args.health)
    if args.adapter:
        _check_adapter(args.adapter)
    options = {}
    for o in args.option or []:
        key, eq, value = o.partition("=")
        if not eq or not key:
            raise ValueError(f"--option: expected KEY=VALUE, got {o!r}")
        options[key] = value
    if args.park == ParkMechanism.CHECKPOINT:
        _check_checkpoint(args.checkpoint_path)
    sizes = parse_sizes(args.size or [])
    if args.lend_max:
        parse_size(args.lend_max, field="--lend-max")
    # Only a missing --engine takes the command's name: an empty one is most often a manager's
    # unset variable, and running under another engine's entry would hide it.
    engine = os.path.basename(cmd[0]) if args.engine is None else args.engine
    if not _ENGINE_NAME.fullmatch(engine):
        # berthd's API refuses it (as its pattern, not in words); say so before asking.
        raise ValueError(f"--engine: {engine!r}: an engine's name has no spaces or control "
                         f"characters (1 to 200 of them)")
    _check_aliases(args.alias or [])
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise ValueError(f"--slots: must be at least 1, got {args.max_in_flight}")
    if args.front and not args.upstream and not any("{port}" in a for a in cmd):
        raise ValueError("with --front, the engine's command must contain {port} (the port the "
                         "run picks) or give --upstream URL")
    if args.park and not args.front:
        raise ValueError("--park needs --front (rule 3: an engine sleeps only behind a front)")
    if args.lend and not args.front:
        # Said here, as --park is, not by berthd after the run asked (or, berthd down, not at
        # all while the run fails open).
        raise ValueError("--lend needs --front (rule 3: an engine lends only behind a front)")
    return RunOptions(
        cmd=cmd, engine=engine, sizes=sizes,
        front=args.front, upstream=args.upstream, priority=args.priority, park=args.park,
        adapter=args.adapter, lend=args.lend, lend_max=args.lend_max, bound=args.bound,
        health=args.health, front_health=args.front_health,
        keep_front=not args.exit_on_drain,
        checkpoint_path=args.checkpoint_path,
        wait_limit_s=_positive(args.wait_limit, "--wait-limit"),
        max_in_flight=args.max_in_flight,
        stop_grace_s=parse_duration(args.stop_grace, field="--stop-grace"),
        term_grace_s=parse_duration(args.term_grace, field="--term-grace"),
        release_grace_s=_positive(args.release_grace, "--release-grace"),
        wake_limit_s=_positive(args.wake_limit, "--wake-limit"),
        require_berthd=args.require_berthd, options=options, aliases=args.alias or [],
        start_limit_s=_positive(args.start_limit, "--start-limit"))


def _cmd_run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    name = args.engine or (os.path.basename(cmd[0]) if cmd else "?")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s berth run[{name}] %(levelname)s: %(message)s")
    if not cmd:
        print("berth run: give the engine's command after --", file=sys.stderr)
        return 2
    from berth.paths import find_config
    try:
        opts = _options(args, cmd)
        find_config()           # a missing named file, at once; the run loads it past its front
    except ValueError as e:     # berth.config.ConfigError is one
        print(f"berth run: {e}", file=sys.stderr)
        return 2
    import asyncio

    from berth.run.main import EngineRun
    code = asyncio.run(EngineRun(opts).main())
    # An engine killed by a signal has returncode -N; exit 128 + N as a shell reports it
    # (sys.exit(-9) would exit 247).
    return 128 - code if code < 0 else code


class _Installed:
    """The installed adapters' names, read from the registry only when a help page is printed
    (argparse fills ``%(installed)s`` from the action's attributes): every ``berth run`` builds
    this parser, and reading entry points would cost its start, which llama-swap's first health
    poll times (issue 30), about 20 ms more."""

    def __str__(self) -> str:
        from berth_plugins.adapters import names  # entry points only: no adapter is imported
        return ", ".join(names()) or "none"


def arguments(p) -> None:
    """Fill ``berth run``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.description = USAGE
    p.epilog = ("exit codes: 130 on SIGINT (Ctrl-C), 129 on SIGHUP (its terminal closed) and 0 "
                "on SIGTERM (a manager's stop), whatever the run was doing (waiting for its "
                "grant, serving, drained; the engine's own code is logged); the engine's code "
                "when it exits on its own; 1 when berthd refused the lease; 2 for bad input or "
                "a front that cannot listen (another process listens on its port; a port only "
                "a connection holds is waited for, up to 75 s)")
    # argparse takes "-5GiB" for an unknown option (only "-5" reads as a negative number), so
    # `--size -5GiB` ended in "expected one argument"; read any word "-<digit>..." as a value,
    # which reaches the flag's own check ("--size: expected a size like '24GiB' ..., got
    # '-5GiB'"). No flag of berth run starts with "-<digit>".
    p._negative_number_matcher = re.compile(r"^-\d")
    p.add_argument("--engine", help="engine name (default: the command's name)")
    p.add_argument("--front", metavar="HOST:PORT", help="where clients reach the engine")
    p.add_argument("--alias", action="append", metavar="ID",
                   help=f"another model ID the gateway routes to this engine (repeatable, up to "
                        f"{MAX_ALIASES})")
    p.add_argument("--upstream", metavar="URL", help="the engine's own URL when CMD has no {port}")
    p.add_argument("--size", action="append", metavar="SIZE[@CARD]",
                   help="memory on one card, e.g. 14GiB@gpu0 (a card's name or PCI address), or "
                        "14GiB for any card berthd places it on; repeat for several cards")
    p.add_argument("--priority", type=int,
                   help="higher keeps its card against lower ones (default: the engine's entry "
                        "in berth.toml, else 0)")
    p.add_argument("--park", choices=[m.value for m in ParkMechanism],
                   help="how the engine gives its memory back and keeps its state: checkpoint "
                        "(cuda-checkpoint to host RAM) or hook (its adapter's sleep); default: "
                        "the engine's entry in berth.toml; with neither, making room drains "
                        "(stops) the engine")
    adapter = p.add_argument("--adapter", metavar="NAME",
                             help="the hook's adapter, one of those installed: %(installed)s "
                                  "(the entry-point group berth.adapters)")
    adapter.installed = _Installed()
    p.add_argument("--lend", action="store_true", help="the engine can lend memory (protocol)")
    p.add_argument("--lend-max", metavar="SIZE",
                   help="the most it may lend on one card (default: its share less its measured "
                        "use, which is about nothing for an engine that preallocates its KV cache)")
    p.add_argument("--bound", choices=[b.value for b in Bound],
                   help="what the lease counts: declared (the --size), current (the driver's "
                        "read of its use) or growth (its use plus room to grow) (default: the "
                        "engine's [engines.X] bound, else declared)")
    _path_arguments(p)


def _path_arguments(p) -> None:
    """``berth run``'s options for the request path, the stop and the wait for berthd."""
    p.add_argument("--health", default="/health",
                   help="the engine's health path, or 'none' (default /health)")
    p.add_argument("--front-health", action="store_true",
                   help="the front answers the --health path 200 itself while it holds requests "
                        "(lease wait, engine start, park): llama-swap's health check then passes "
                        "at its first poll and requests wait in the front (berth llama-swap wrap "
                        "writes it)")
    p.add_argument("--keep-front", action="store_true",
                   help="the default, kept for run lines that write it: after berthd drains the "
                        "engine, the run and its front stay; writes are held and the next one "
                        "asks for a new grant and starts the engine again on the card it is "
                        "given (a cold wake)")
    p.add_argument("--exit-on-drain", action="store_true",
                   help="exit (code 0) when berthd drains the engine instead of keeping the "
                        "front, for a manager that must see the exit and start the run itself")
    p.add_argument("--checkpoint-path", help="cuda-checkpoint to use (default: "
                                             "$BERTH_CUDA_CHECKPOINT, else cuda-checkpoint on "
                                             "PATH)")
    p.add_argument("--wait-limit", help="longest a request is held (default: berthd's "
                                        "[policy] wait_limit, else 120s)")
    p.add_argument("--slots", "--max-in-flight", dest="max_in_flight", type=int, metavar="N",
                   help="the engine runs N requests at once: the front forwards at most N and "
                        "holds the rest, so a park waits only for running requests (default: "
                        "the engine's [engines.X] slots, else measured: llama-server's /props "
                        "or --parallel, vLLM's --max-num-seqs, ComfyUI 1; unknown: forward all)")
    p.add_argument("--stop-grace", default="1s", help="in-flight grace on stop (default 1s)")
    p.add_argument("--term-grace", default="4s", help="SIGTERM to SIGKILL (default 4s)")
    p.add_argument("--release-grace", help="park/lend time limit (default: berthd's [policy])")
    p.add_argument("--wake-limit", help="wake/return time limit (default: berthd's [policy])")
    p.add_argument("--require-berthd", action="store_true",
                   help="wait for berthd instead of running the engine unleased (fail-open) "
                        "when it cannot be reached")
    p.add_argument("--start-limit", default="120s",
                   help="with berthd unreachable, the engine starts unleased only if it fits "
                        "beside what the card holds; otherwise the run waits this long for "
                        "berthd, then gives up (default 120s)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a mechanism option (e.g. model=ID for llama.cpp's router)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    p.set_defaults(func=_cmd_run)
    startup.keep_paused(p)          # the run says started() past its load (EngineRun.main)
