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

from berth import startup

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
    Command("wake", "wake a parked engine, or start a drained one again",
            "berth.board_text:operator_arguments"),
    Command("drain", "stop an engine", "berth.board_text:operator_arguments"),
    Command("hold", "protect an engine from being displaced",
            "berth.board_text:operator_arguments"),
    Command("release-hold", "let a held engine be displaced again",
            "berth.board_text:operator_arguments"),
    Command("run", "run an engine under a lease, behind its own front",
            "berth.run.cli:arguments"),
    Command("size", "the memory to declare for an engine: from a GGUF file, or its measured peak",
            "berth.size:arguments"),
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


def _close(word: str, known) -> str | None:
    """The one of ``known`` that ``word`` most likely misspells, or ``None``. Options are
    compared without their dashes, which every one shares: with them, ``--bogus`` was "like"
    ``--host``."""
    import difflib  # only on a refusal: every start would pay for it
    names = {k.lstrip("-"): k for k in known if isinstance(k, str)}
    found = difflib.get_close_matches(word.lstrip("-"), list(names), n=1)
    return names[found[0]] if found else None


class _Parser(argparse.ArgumentParser):
    """``berth``'s parsers, every subcommand's included (argparse makes a subparser of its
    parent's class). A new user's ``berth run --sise 8GiB`` got ``berth``'s own usage and
    "unrecognized arguments" with no hint: argparse hands a subcommand's unknown words up to
    the top parser, which knows neither the subcommand's usage nor its options. Here the
    subcommand that got them refuses them itself, and a misspelled option or choice (a
    subcommand's name) names the likely one."""

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._guess(extras)}")
        return parsed, extras

    def error(self, message):
        # argparse checks required options before it looks at unknown words: `berth sim engine
        # --port 1 --wieghts 1GiB` only said "--weights is required", not what was misspelled.
        if message.startswith("the following arguments are required"):
            words = getattr(self, "_words", [])
            words = words[:words.index("--")] if "--" in words else words
            unknown = [w for w in words if w.startswith("--") and not any(
                o.startswith(w.partition("=")[0]) for o in self._option_string_actions)]
            guess = self._guess(unknown)
            if guess:
                message += f"; unrecognized: {' '.join(unknown)}{guess}"
        super().error(message)

    def _guess(self, words: list[str]) -> str:
        """`` (did you mean --size?)`` for the first of ``words`` that misspells an option."""
        for word in words:
            if word.startswith("-") and len(word) > 1:
                like = _close(word.partition("=")[0], self._option_string_actions)
                if like:
                    return f" (did you mean {like}?)"
        return ""

    def _check_value(self, action, value):
        if action.choices is not None and isinstance(value, str) and value not in action.choices:
            like = _close(value, action.choices)
            if like:
                raise argparse.ArgumentError(action, (
                    f"invalid choice: {value!r} (did you mean {like!r}? choose from "
                    f"{', '.join(map(repr, action.choices))})"))
        super()._check_value(action, value)


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
    parser = _Parser(
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
    return _main(sys.argv[1:] if argv is None else list(argv), entry=argv is None)


def _main(argv: list[str], entry: bool) -> int:
    """``berth ARGV``; ``entry``: as the process's own command (its start pauses the garbage
    collector, :mod:`berth.startup`), not called by a caller in its own process."""
    if entry:
        startup.pause()
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not startup.kept(args):
            startup.started()
        return _run(parser, args)
    finally:
        startup.started()       # a command that exits before it said so (one call, a refusal)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the parsed command: its exit status."""
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
    return _main(["daemon", *(sys.argv[1:] if argv is None else argv)], entry=argv is None)


if __name__ == "__main__":
    sys.exit(main())
