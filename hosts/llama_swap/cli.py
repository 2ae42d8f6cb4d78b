"""``berth llama-swap …``: the llama-swap host's subcommands.

    berth llama-swap wrap CONFIG.yaml [--park auto|checkpoint|none] [--size-from berth.toml]
                                      [-o OUT] [--berth PATH] [--checkpoint-path PATH]
                                      [--health-check-timeout SECONDS]

Prints (or writes to OUT) the config with every model's ``cmd`` under ``berth run``; notes and
warnings go to stderr. Exit status 0, or 2 with one message naming the model and key.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from berth.paths import write_atomic

from .wrap import MIN_HEALTH_CHECK_TIMEOUT_S, WrapError, WrapOptions, sizes_from, wrap_text

__all__ = ["arguments"]

_PROG = "berth llama-swap wrap"


def _cmd_wrap(args) -> int:
    if args.health_check_timeout < 1:
        print(f"{_PROG}: --health-check-timeout: must be at least 1 second, got "
              f"{args.health_check_timeout}", file=sys.stderr)
        return 2
    read = _read_source(args)
    if read is None:
        return 2
    text, source = read
    sizes = None
    if args.size_from:
        try:
            sizes = sizes_from(args.size_from)
        except (OSError, ValueError) as e:      # berth.config.ConfigError is a ValueError
            print(f"{_PROG}: --size-from: {e}", file=sys.stderr)
            return 2
    opts = WrapOptions(park=args.park, sizes=sizes, berth=args.berth,
                       checkpoint_path=args.checkpoint_path,
                       min_health_check_timeout_s=args.health_check_timeout)
    try:
        out, report = wrap_text(text, source, opts)
    except WrapError as e:
        print(f"{_PROG}: {e}", file=sys.stderr)
        return 2
    if args.output:
        try:
            # no half-written config for a watching llama-swap to load
            write_atomic(args.output, out.encode(), 0o644)
        except OSError as e:
            print(f"{_PROG}: -o {args.output}: {e.strerror or e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(out)
    report.warnings += _entries_missing(report) if sizes is None else []
    for line in report.warnings:
        print(f"{_PROG}: warning: {line}", file=sys.stderr)
    if not args.quiet:
        for line in report.notes:
            print(f"{_PROG}: note: {line}", file=sys.stderr)
        if sizes is None and report.wrapped:
            print(f"{_PROG}: note: sizes come from berth.toml at lease time: each model needs "
                  f"an [engines.\"<engine>\"] entry with a size, <engine> being its --engine "
                  f"(the model ID, unless a warning above names another; check with "
                  f"--size-from)", file=sys.stderr)
        done = f"wrapped {len(report.wrapped)} model(s)"
        if report.already:
            done += f"; already wrapped, left as they were: {', '.join(report.already)}"
        print(f"{_PROG}: {done}" + (f"; written to {args.output}" if args.output else ""),
              file=sys.stderr)
    return 0


def _read_source(args) -> tuple[str, str] | None:
    """CONFIG.yaml's text and its name for messages, or ``None`` once a message is printed."""
    try:
        if args.config == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            text, source = Path(args.config).read_text(), args.config
    except OSError as e:
        print(f"{_PROG}: {args.config}: {e.strerror or e}", file=sys.stderr)
        return None
    except UnicodeDecodeError as e:
        print(f"{_PROG}: {args.config}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
              f"offset {e.start}); a llama-swap config is a YAML file", file=sys.stderr)
        return None
    if args.output and args.config != "-" and _same_file(args.config, args.output):
        # The wrapped config keeps no YAML comments, and its header says to edit the source
        # and wrap it again: written over the source, there is no source left to edit.
        suggested = Path(args.config).with_suffix(".berth.yaml").name
        print(f"{_PROG}: -o {args.output}: that is the source {args.config} itself; its comments would be "
              f"lost and the source gone; write the wrapped config to another file "
              f"(-o {suggested}) and point llama-swap at it", file=sys.stderr)
        return None
    return text, source


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:                     # -o names a file not there yet: not the source
        return False


def _entries_missing(report) -> list[str]:
    """Without ``--size-from``, the wrapped runs take their sizes from berth.toml at lease time:
    the warning (a list of one, or none) naming the wrapped engines that the berth.toml found
    here (:func:`berth.paths.config_path`) has no entry for. Without it, every request to such
    a model is llama-swap's opaque 500 "upstream command exited prematurely" (review finding)."""
    from berth.paths import config_path
    path = config_path()
    try:
        entries = sizes_from(path) if path.exists() else {}
    except (OSError, ValueError) as e:      # berth.config.ConfigError is a ValueError
        return [f"{path}: {e}; berthd refuses a lease while its berth.toml is bad"]
    missing = [e for e in (report.engines.get(m, m) for m in report.wrapped) if e not in entries]
    if not missing:
        return []
    where = (f"{path} has no" if path.exists() else
             f"there is no {path} (BERTH_CONFIG, else the default place), so no")
    return [f"{where} [engines.\"<engine>\"] entry for {', '.join(missing)}: berthd refuses a "
            f"lease with no size, and llama-swap would answer their requests with 500 "
            f"\"upstream command exited prematurely\"; give each an entry with size = \"…GiB\" "
            f"in the berth.toml berthd reads (at lease time; --size-from PATH checks that file)"]


def arguments(p) -> None:
    """Fill ``berth llama-swap``'s parser with its subcommand ``wrap``
    (:data:`berth.cli.COMMANDS`)."""
    p.description = "Glue for llama-swap, whose models run under `berth run`."
    lsub = p.add_subparsers(dest="llama_swap_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    w = lsub.add_parser(
        "wrap", help="print a llama-swap config whose models run under berth run",
        description="Print a llama-swap config in which every model's cmd runs under "
                    "`berth run --engine <model id> --front 127.0.0.1:${PORT} --front-health "
                    "-- <engine>`, the engine's ${PORT} becomes {port}, groups let models stay "
                    "loaded together (Berth decides who parks), healthCheckTimeout and "
                    "unloadTimeout fit a lease wait and berth run's stop sequence, and reads of "
                    "a model that is not running start nothing (upstream.ignorePaths). See "
                    "hosts/llama_swap/README.md.")
    w.add_argument("config", metavar="CONFIG.yaml", help="the llama-swap config ('-': stdin)")
    w.add_argument("--park", choices=("auto", "checkpoint", "none"), default="auto",
                   help="auto (default): --park checkpoint on every berth run line when "
                        "cuda-checkpoint is found (--checkpoint-path, $BERTH_CUDA_CHECKPOINT, "
                        "PATH), else none; checkpoint: always (not for container cmds); "
                        "none: models drain to make room")
    w.add_argument("--size-from", metavar="berth.toml",
                   help="put each model's size from its [engines.\"<engine>\"] entry on its "
                        "berth run line, and warn for models with no entry (optional: berthd "
                        "reads the entries at lease time anyway)")
    w.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    w.add_argument("--berth", metavar="PATH",
                   help="the berth executable llama-swap runs (it runs no shell: absolute, or "
                        "on its PATH); default: the absolute path of this berth")
    w.add_argument("--checkpoint-path", metavar="PATH",
                   help="cuda-checkpoint for --park checkpoint (passed to berth run)")
    w.add_argument("--health-check-timeout", type=int, default=MIN_HEALTH_CHECK_TIMEOUT_S,
                   metavar="SECONDS",
                   help=f"raise healthCheckTimeout to at least this (default "
                        f"{MIN_HEALTH_CHECK_TIMEOUT_S}): it must cover a wait for a lease "
                        f"plus the load")
    w.add_argument("-q", "--quiet", action="store_true", help="print warnings only")
    w.set_defaults(func=_cmd_wrap)
