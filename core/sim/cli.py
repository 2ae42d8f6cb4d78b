"""``berth sim``: declare simulated cards, show them, run a stub engine.

Source: issue 3; DESIGN.md "Commands" (``berth sim …``)::

    berth sim init --card NAME=SIZE[@PCI]… [--baseline SIZE] [--free-delay S]
                   [--checkpoint-bps N] [--replace] [--dir D]
    berth sim cards [--json] [--dir D]
    berth sim engine --port P --weights SIZE [...]      (see berth.sim.engine)
    berth sim ollama --model NAME=SIZE [...]            (see berth.sim.ollama)
    berth sim comfyui --port P --models DIR [...]       (see berth.sim.comfyui)
    berth sim charge --size SIZE [--per-child SIZE] -- CMD…   (see berth.sim.charge)

The stand-in ``cuda-checkpoint`` is its own command, ``berth-sim-cuda-checkpoint``, so that it can
be put on ``PATH`` under the real name; ``charge`` is also ``berth-sim-charge``, which starts
without the ``berth`` command's own start-up (it runs before every engine start it wraps).
"""

from __future__ import annotations

import argparse
import json
import sys

from berth import startup
from berth.decide.units import format_duration, format_size, parse_duration, parse_size
from berth.sim.cards import CHECKPOINTED, CardSpec, SimCards, SimError

__all__ = ["arguments", "parse_card", "engine_arguments"]


def parse_card(text: str, index: int, baseline_bytes: int = 0) -> CardSpec:
    """``NAME=SIZE[@PCI]`` → :class:`CardSpec`. Raises ``ValueError`` naming ``--card``."""
    name, eq, rest = text.partition("=")
    if not eq or not name.strip() or not rest.strip():
        raise ValueError(f"--card: expected NAME=SIZE[@PCI] like gpu0=24GiB@0000:01:00.0, got {text!r}")
    size, _, pci = rest.partition("@")
    total = parse_size(size, field=f"--card {name}")
    return CardSpec.make(name.strip(), total, pci=pci.strip() or None,
                         baseline_bytes=baseline_bytes, index=index)


def _init(args: argparse.Namespace) -> int:
    try:
        baseline = parse_size(args.baseline, field="--baseline")
        specs = [parse_card(c, i, baseline) for i, c in enumerate(args.card)]
        delay = parse_duration(args.free_delay, field="--free-delay")
        if not args.checkpoint_bps > 0:
            raise ValueError(f"--checkpoint-bps: must be > 0, got {args.checkpoint_bps}")
        store = SimCards.init(args.dir, specs, free_delay_s=delay,
                              restore_bytes_per_s=args.checkpoint_bps, replace=args.replace)
    except (ValueError, SimError) as e:
        print(f"berth sim init: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"--dir {args.dir}" if args.dir else f"$BERTH_SIM_DIR ({e.filename})"
        print(f"berth sim init: {where}: cannot create it or write there: {e.strerror or e}",
              file=sys.stderr)
        return 2
    print(f"declared {len(specs)} simulated card(s) in {store.directory}")
    return _cards(args)


def _cards(args: argparse.Namespace) -> int:
    try:
        snap = SimCards(args.dir).snapshot()
    except SimError as e:
        print(f"berth sim cards: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({
            "free_delay_s": snap.free_delay_s, "restore_bytes_per_s": snap.restore_bytes_per_s,
            "cards": [{**c.spec.as_dict(), "index": c.index, "used_bytes": c.used_bytes,
                       "free_bytes": c.free_bytes, "oom_events": c.oom_events,
                       "processes": {str(pid): n for pid, n in c.processes.items()}}
                      for c in snap.cards],
            "processes": [{"pid": p.pid, "start_time": p.start_time, "state": p.state,
                           "stuck": p.stuck, "gone_for_s": p.gone_for_s, "card": p.card,
                           "host": p.host} for p in snap.procs]}, indent=2))
        return 0
    rows = [("NAME", "PCI", "UUID", "TOTAL", "USED", "FREE", "OOM", "PROCESSES")]
    for c in snap.cards:
        procs = []
        for p in snap.procs:
            on_card, in_host = p.card.get(c.spec.pci), p.host.get(c.spec.pci)
            if on_card is None and in_host is None:
                continue
            state = p.state + (" (stuck)" if p.stuck else "")
            if p.gone_for_s is not None:
                state = f"exited {format_duration(p.gone_for_s)} ago"
            size = format_size(in_host) + " in host RAM" if p.state == CHECKPOINTED else format_size(on_card or 0)
            procs.append(f"{p.pid} {size} {state}")
        rows.append((c.spec.name, c.spec.pci, c.spec.uuid, format_size(c.spec.total_bytes),
                     format_size(c.used_bytes), format_size(c.free_bytes), str(c.oom_events),
                     ", ".join(procs) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + "  " + r[-1])
    print(f"free delay after exit {format_duration(snap.free_delay_s)}; checkpoint speed "
          f"{format_size(int(snap.restore_bytes_per_s))}/s")
    return 0


def engine_arguments(p: argparse.ArgumentParser) -> None:
    """The ``berth sim engine`` flags (the engine itself is :mod:`berth.sim.engine`)."""
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--card", help="a PCI address, sim card name or UUID (default: every card "
                                  "of $CUDA_VISIBLE_DEVICES, each with the same profile)")
    p.add_argument("--weights", required=True, metavar="SIZE", help="weights to load, e.g. 14GiB")
    p.add_argument("--load-s", default="0", metavar="S", help="seconds the load takes (default 0)")
    p.add_argument("--kv-per-token", default="131072", metavar="BYTES",
                   help="KV bytes per token (default 128KiB)")
    p.add_argument("--tokens-per-s", type=float, default=500.0, help="generation speed (default 500)")
    p.add_argument("--protocol", action="store_true", help="speak the Berth engine protocol")
    p.add_argument("--lend", action="store_true", help="answer /berth/v1/lend and /return")
    p.add_argument("--kv-pool", metavar="SIZE", help="preallocate a KV pool of SIZE (like vLLM)")
    p.add_argument("--residual", default="256MiB", metavar="SIZE",
                   help="the context, kept by a park (default 256MiB)")
    p.add_argument("--model", default="stub", help="the model name it serves (default stub)")
    p.add_argument("-np", "--parallel", type=int, metavar="N",
                   help="run at most N requests at once and queue the rest, and say N in GET "
                        "/props total_slots, as llama-server does (default: every request at once)")
    p.add_argument("--park-noop", action="store_true", help="test knob: park answers 200, frees nothing")
    p.add_argument("--lend-noop", action="store_true", help="test knob: lend answers 200, frees nothing")
    p.add_argument("--wake-hang", action="store_true", help="test knob: wake never answers")
    p.add_argument("--load-hold", metavar="PATH",
                   help="test knob: while the file PATH exists, a load (at start, and at each "
                        "start of a restarted engine) holds its weights on the card but does not "
                        "finish: /health answers 503 until PATH is removed")
    p.add_argument("--token-hold", metavar="PATH",
                   help="test knob: while the file PATH exists, a request that has generated its "
                        "first token generates no more (it keeps its slot and its KV); it goes on "
                        "once PATH is removed")
    p.add_argument("--crash-on-term", action="store_true",
                   help="stop as a crashed engine does: on SIGTERM/SIGINT die by that signal "
                        "without freeing; the driver frees its memory after the exit plus the "
                        "free delay")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")


def _engine(args: argparse.Namespace) -> int:
    from berth.sim.engine import run  # aiohttp is loaded only for the engine
    return run(args)


class _FilledWhenChosen(argparse._SubParsersAction):
    """Subcommands whose flags are added only when chosen: the stand-ins' modules (aiohttp for
    ``ollama``, the ComfyUI stand-in's own) then load only for their own subcommand, not for
    ``berth sim engine`` nor ``init`` (issue 38: the test suite starts these hundreds of times).
    ``fill[name](parser)`` adds ``name``'s flags."""

    def __call__(self, parser, namespace, values, option_string=None):
        add = getattr(self, "fill", {}).pop(values[0], None) if values else None
        if add is not None:
            add(self._name_parser_map[values[0]])
        super().__call__(parser, namespace, values, option_string)


def _charge_arguments(p: argparse.ArgumentParser) -> None:
    from berth.sim import charge
    charge.arguments(p)
    p.set_defaults(func=charge.run)


def _comfyui_arguments(p: argparse.ArgumentParser) -> None:
    from berth.sim import comfyui
    comfyui.arguments(p)
    p.set_defaults(func=comfyui.run)


def _ollama_arguments(p: argparse.ArgumentParser) -> None:
    from berth.sim.ollama import arguments  # aiohttp is loaded only for the stand-ins
    arguments(p)
    p.set_defaults(func=_ollama)


def _ollama(args: argparse.Namespace) -> int:
    from berth.sim.ollama import run
    return run(args)


def arguments(sim: argparse.ArgumentParser) -> None:
    """Fill ``berth sim``'s parser with its ``init``, ``cards``, ``engine``, ``charge``,
    ``comfyui`` and ``ollama`` subcommands (:data:`berth.cli.COMMANDS`)."""
    # the module docstring's first line, less its reST: a help page is plain text
    sim.description = __doc__.split("\n\n")[0].replace("``", "")
    sim.register("action", "parsers", _FilledWhenChosen)
    sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND", required=True)
    sub.fill = {"charge": _charge_arguments, "comfyui": _comfyui_arguments,
                "ollama": _ollama_arguments}

    p = sub.add_parser("init", help="declare simulated cards")
    p.add_argument("--card", action="append", required=True, metavar="NAME=SIZE[@PCI]",
                   help="a card, e.g. gpu0=24GiB or gpu1=48GiB@0000:41:00.0 (repeatable)")
    p.add_argument("--baseline", default="0", metavar="SIZE",
                   help="memory always used on every card (driver context, display)")
    p.add_argument("--free-delay", default="0.5", metavar="S",
                   help="seconds between a process's exit and its memory going free (default 0.5)")
    p.add_argument("--checkpoint-bps", type=float, default=7e9, metavar="N",
                   help="checkpoint/restore speed in bytes per second (default 7e9)")
    p.add_argument("--replace", action="store_true",
                   help="redeclare cards that differ, if no process holds memory on them")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")
    p.set_defaults(func=_init, json=False)

    p = sub.add_parser("cards", help="show the simulated cards, their use and processes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")
    p.set_defaults(func=_cards)

    p = sub.add_parser("engine", help="a stub OpenAI-style engine on a simulated card")
    engine_arguments(p)
    p.set_defaults(func=_engine)
    startup.keep_paused(p)          # the engine says started() once it listens

    sub.add_parser("charge", help="run a real engine whose memory shows on the simulated "
                                  "cards while it lives (its children's too)")
    sub.add_parser("comfyui", help="a ComfyUI stand-in that loads custom nodes and runs "
                                   "prompts on a simulated card")
    sub.add_parser("ollama", help="an Ollama stand-in (ollama serve's API) whose loaded "
                                  "models hold memory on a simulated card")
