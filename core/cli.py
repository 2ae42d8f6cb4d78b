"""The ``berth`` command: a static table of subcommands, and only the chosen one imported.

Source: issue 23 "A CLI that starts fast". Every command's module imports what it runs
(aiohttp, pydantic, PyYAML, …), which costs more than Python's own start; ``berth --help`` lists
:data:`COMMANDS` from this table alone, and ``berth CMD …`` imports CMD's module and asks its
function (``module:function`` in the table) to fill CMD's parser: add its arguments, its
``description`` and ``set_defaults(func=…)``, where ``func(args)`` runs the command and returns
its exit status. The folder layout still shows the architecture: each area builds its own
subcommands' parsers; this module only names them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NamedTuple

__all__ = ["COMMANDS", "Command", "main", "daemon_main", "build_parser"]


class Command(NamedTuple):
    """One subcommand: its ``name``, the one line ``berth --help`` shows, and ``builds``, the
    ``"module:function"`` whose ``function(parser)`` fills its parser."""

    name: str
    help: str
    builds: str


#: Where every process finds berth.toml, in words (:mod:`berth.paths` computes it and keeps the
#: same words; importing it here would cost ``berth --help`` a module).
CONFIG_PLACES = ("$BERTH_CONFIG, else /etc/berth/berth.toml as root, else "
                 "$XDG_CONFIG_HOME/berth/berth.toml (~/.config/berth/berth.toml)")

#: Every subcommand, in the order ``berth --help`` lists them.
COMMANDS = (
    Command("daemon", "run berthd, the broker for every card of this machine",
            "berth.daemon.main:daemon_arguments"),
    Command("config", "check a berth.toml", "berth.daemon.main:config_arguments"),
    Command("status", "the board: cards, shares, the waiting queue, counters",
            "berth.board_text:status_arguments"),
    Command("park", "park an engine (it sleeps in host RAM)",
            "berth.board_text:operator_arguments"),
    Command("wake", "wake a parked engine", "berth.board_text:operator_arguments"),
    Command("drain", "stop an engine", "berth.board_text:operator_arguments"),
    Command("hold", "protect an engine from being displaced",
            "berth.board_text:operator_arguments"),
    Command("release-hold", "let a held engine be displaced again",
            "berth.board_text:operator_arguments"),
    Command("run", "run an engine under a lease, behind its own front",
            "berth.run.cli:arguments"),
    Command("sim", "the simulation kit: simulated cards and a stub engine",
            "berth.sim.cli:arguments"),
    Command("k8s", "Kubernetes: a claim's leases, this node's ResourceSlice (berth-gpu[k8s])",
            "berth.k8s.cli:arguments"),
    Command("gateway", "one endpoint for every engine (routing by model, peers)",
            "berth.gateway.cli:arguments"),
    Command("llama-swap", "the llama-swap host: run its models under berth run",
            "berth_hosts.llama_swap.cli:arguments"),
    Command("supervisor", "the supervisord host: its eventlistener",
            "berth_hosts.supervisor.cli:arguments"),
    Command("comfyui", "the ComfyUI host: install the node into a ComfyUI",
            "berth_hosts.comfyui.cli:arguments"),
    Command("demo", "the main job on a simulated card: an LLM and ComfyUI on one card, parks "
                    "and wakes both ways", "berth.demo:arguments"),
)


def _chosen(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (``berth``'s own
    options, ``-h`` and ``--version``, take no value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """``berth``'s parser. Every subcommand of :data:`COMMANDS` is listed; only the one
    ``argv`` names (none when ``argv`` is ``None``) is filled, importing its module."""
    parser = argparse.ArgumentParser(
        prog="berth", description="Berth: a GPU-memory broker for local inference engines.",
        epilog=f"Every command reads the config berthd reads: {CONFIG_PLACES}; "
               f"`berth config check` with no path checks it.")
    from berth import __version__
    parser.add_argument("--version", action="version", version=f"berth {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv or [])
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help)
        if cmd.name == chosen:
            module, _, function = cmd.builds.partition(":")
            getattr(importlib.import_module(module), function)(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C in a command with no handler of its own (wrap reading stdin, a prompt): leave
        # as a shell tool does, with 130 and no traceback (berth run and berthd stop in order).
        print(file=sys.stderr)
        return 130
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
