"""The ``berth`` command. Each area registers its own subcommands (``register(subparsers)``)
so the folder layout shows the architecture; this module only assembles them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["main", "daemon_main", "build_parser"]

#: Modules that add subcommands, in the order ``berth --help`` lists them.
_COMMAND_MODULES = (
    "berth.daemon.main",
    "berth.board",
    "berth.run.cli",
    "berth.sim.cli",
    "berth.gateway.cli",
    "berth_hosts.llama_swap.cli",
    "berth_hosts.supervisor.cli",
    "berth_hosts.comfyui.cli",
    "berth.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="berth", description="Berth: a GPU-memory broker for local inference engines.")
    from berth import __version__
    parser.add_argument("--version", action="version", version=f"berth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # `berth status | head -1`: the reader left; say nothing more, as cat and grep do (the
        # flush at exit would raise again, so stdout goes to /dev/null first).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return int(rc or 0)


def daemon_main(argv: list[str] | None = None) -> int:
    """``berthd`` is ``berth daemon``."""
    return main(["daemon", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
