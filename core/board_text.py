"""The board as text in a terminal: ``berth status``, and the operator commands ``berth
park|wake|drain|hold|release-hold``. Source: issue 4 "The board", "Operator commands". (The
board in a browser is :mod:`berth.daemon.board_web`; its page is ``board_web/static/``.)"""

from __future__ import annotations

import argparse
import json
import sys
import time

from berth import client_sync, startup
from berth.client_sync import ApiError, BerthdUnavailable, ConfigUnusable
from berth.decide.kinds import REJECTED_WITH_FREE_WORDS
from berth.decide.units import format_duration, format_size

__all__ = ["status_arguments", "operator_arguments", "render"]

_WIDTH = 48
_STATE_MARK = {"active": "█", "resuming": "█", "returning": "█", "lending": "█", "lent": "▓",
               "parking": "▒", "parked": "▒", "draining": "░", "released": "░"}


def _bar(card: dict) -> str:
    total = card["total_bytes"] or 1
    parts = [("R", card["reserve_bytes"]), ("B", card["baseline_bytes"]),
             ("S", card["stowaway_bytes"]), ("C", card["claim_bytes"])]
    parts += [(_STATE_MARK.get(sh["state"], "?"), sh["counted_bytes"]) for sh in card["shares"]]
    out = ""
    for mark, b in parts:
        out += mark * round(_WIDTH * max(0, b) / total)
    out = out[:_WIDTH]
    return out + "·" * (_WIDTH - len(out))


def render(st: dict) -> str:
    """The board as text: a bar per card (R reserve, B baseline, S stowaways, C claims, █ active,
    ▓ lent, ▒ parked, ░ draining, · free), its shares, the waiting queue (a waiter whose process
    already runs is marked over budget), leases with a problem to fix (``!``: processes left
    holding memory after their main process went), the counters."""
    lines = []
    until = {le["id"]: _until(le) for le in st["leases"]}
    for c in st["cards"]:
        lines.append(f"{c['name']} {c['pci']}  [{_bar(c)}]  {format_size(c['total_bytes'])} total, "
                     f"budget {format_size(c['budget_bytes'])}, driver free "
                     f"{format_size(c['free_bytes'])}")
        # Stowaways by PID, so that the process to deal with is named (issue 12 case 5).
        pids = ", ".join(f"pid {s['pid']}" + (f" {s['program']} (user {s['user']})"
                                              if s.get("program") else "")
                         + f" {format_size(s['bytes'])}" for s in c.get("stowaways") or [])
        lines.append(f"    reserve {format_size(c['reserve_bytes'])} · baseline "
                     f"{format_size(c['baseline_bytes'])} · stowaways "
                     f"{format_size(c['stowaway_bytes'])}" + (f" ({pids})" if pids else "")
                     + f" · claims {format_size(c['claim_bytes'])}"
                     + (f" · suggested reserve {format_size(c['suggested_reserve_bytes'])} (above "
                        f"the configured reserve)" if c.get("reserve_below_suggested") else ""))
        for sh in c["shares"]:
            marks = (" held" if sh.get("held") else "") + (
                f" ! {format_size(sh['over_bytes'])} over its lease" if sh.get("over_bytes") else "")
            lines.append(f"    {sh['engine']:<20} {sh['state']:<10} {format_size(sh['counted_bytes'])}"
                         f" counted, {_size_words(sh)}"
                         f"  ({sh['lease']}){marks}{until.get(sh['lease'], '')}")
    lines += _waiting_lines(st["waiting"], st["leases"])
    lines += _moving_lines(st["leases"], st.get("drained") or [])
    lines += _drained_lines(st.get("drained") or [])
    lines += _problem_lines(st)
    ram = st.get("host_ram") or {}
    if ram.get("budget_bytes") is not None:
        lines.append(f"host RAM for parks: {format_size(ram['parked_bytes'])} parked of a "
                     f"{format_size(ram['budget_bytes'])} budget")
    k = st["counters"]
    lines.append("since start: " + ", ".join(f"{label} {k.get(n, 0)}" for n, label in (
        ("grants", "grants"), ("parks", "parks by hook"), ("checkpoints", "parks by checkpoint"),
        ("wakes", "wakes"), ("lends", "lends"), ("drains", "drains"), ("moves", "moves"),
        ("fallbacks_to_drain", "fallbacks to drain"), ("unparked", "unparked"),
        ("admissions_rejected_with_free", REJECTED_WITH_FREE_WORDS))))
    lines.append(f"reserve: {k['reserve_fraction']:.1%} of the cards")
    if "adapters" in st:            # berthd's registry of adapters (issue 38)
        lines.append("adapters: " + (", ".join(st["adapters"]) or "none"))
    return "\n".join(lines)


def _waiting_lines(waiting: list[dict], leases: list[dict] = ()) -> list[str]:
    """``waiting:`` and each waiter with what it needs, how long it waited and why; behind a
    holder of higher priority, until when that priority keeps the card and what to do."""
    if not waiting:
        return ["waiting: none"]
    lines = ["waiting:"]
    for w in waiting:
        need = ", ".join(f"{x.get('card_name') or x['card']} {format_size(x['size_bytes'])}"
                         for x in w["need"])
        lines.append(f"    {w['engine']:<20} {w['kind']:<7} needs {need or '—'}, waited "
                     f"{w['waited_s']:.1f}s ({w['id']})")
        if w.get("why"):
            lines.append(f"        {w['why']}")
            lines += _outranked_lines(w, leases)
        if w.get("note"):
            lines.append(f"        ! {w['note']}")
    return lines


def _outranked_lines(w: dict, leases: list[dict]) -> list[str]:
    """For a waiter named in ``w["why"]``'s holder of higher priority: until when its priority
    keeps the card (its ``keep_warm`` after its last request) and the two ways past it; the
    decision's reason names the holder, not what a user can do (fresh-user check, 2026-12-03)."""
    mine = next((le for le in leases if le["id"] == w["id"]), None)
    if mine is None:
        return []
    cards = {x["card"] for x in w["need"]}
    out = []
    for le in leases:
        if le["priority"] <= mine["priority"] or f"lease {le['id']}" not in w["why"]:
            continue
        names = ", ".join(sh.get("card_name") or sh["card"] for sh in le["shares"]
                          if sh["card"] in cards) or "its card"
        at, left = le.get("keep_warm_until"), le.get("keep_warm_left_s")
        until = (f"until its keep_warm ends at {time.strftime('%H:%M:%S', time.localtime(at))}"
                 f" ({format_duration(left)}; sooner if it stops)" if at and left is not None
                 else "while it serves and for its keep_warm after its last request")
        out.append(f"        {le['engine']}'s priority {le['priority']} keeps {names} {until}; "
                   f"to go first: `berth drain {le['engine']}` (an operator), or run "
                   f"{w['engine']} with --priority {le['priority']} or more")
    return out


def escapees_words(escapees: list[dict]) -> str:
    """A lease's escapees (status ``escapees``) in words: which processes, where, how much, and
    what the user can do (issue 36: processes that left the run's tree still count for it)."""
    said = ", ".join(f"pid {e['pid']} ({format_size(e['bytes'] or 0)} on "
                     f"{e.get('card_name') or e['card']})" for e in escapees)
    return (f"{len(escapees)} process(es) left its run's process tree and still hold memory, "
            f"counted for this lease: {said}; they are not stopped with the engine: stop them "
            f"(Berth does not signal processes outside the run's tree)")


def _problem_lines(st: dict) -> list[str]:
    """A line per lease with something to fix or know (``!``: a note, a size far from its
    peak; a pinned card that no move may change) and per host note (issue 37)."""
    lines = []
    for le in st["leases"]:
        if le.get("note"):
            lines.append(f"! {le['engine']} ({le['id']}): {le['note']}")
        if (le.get("capabilities") or {}).get("pinned"):
            lines.append(f"  {le['engine']} ({le['id']}): {le['move']['why']}")
        if le.get("size_note"):
            lines.append(f"! {le['engine']} ({le['id']}) size: {le['size_note']}")
        if le.get("escapees"):
            lines.append(f"! {le['engine']} ({le['id']}): {escapees_words(le['escapees'])}")
    for n in st.get("host_notes") or []:
        lines.append(f"! {n['engine']} ({time.strftime('%H:%M:%S', time.localtime(n['at']))}): "
                     f"{n['text']}")
    return lines


def _moving_lines(leases: list[dict], drained: list[dict]) -> list[str]:
    """A line per engine moving to another card (issue 35): ``moving gpu0 -> gpu1``, for how
    long, and why; by checkpoint and restore (its lease's ``moving``), or by a restart (its
    lease's while it drains, then its run's drained entry's until the engine serves there)."""
    moves = {le["engine"]: (le["moving"], 0) for le in leases if le.get("moving")}
    for r in drained:
        if r.get("moving"):
            moves.setdefault(r["engine"], (r["moving"], r.get("waiters") or 0))
    lines = []
    for engine, (m, waiters) in moves.items():
        how = " (a restart there)" if m.get("how") == "restart" else ""
        held = f", {waiters} request(s) held" if waiters else ""
        lines.append(f"    {engine:<20} moving {'+'.join(m['from'])} -> {m['to']} "
                     f"for {format_duration(m['elapsed_s'])}: {m['why']}{how}{held}")
    return ["moving to another card (a checkpoint restored there, or the engine started "
            "again there):"] + lines if lines else []


def _drained_lines(drained: list[dict]) -> list[str]:
    """``drained:`` and one line per run whose engine was drained and whose front stays
    (issue 35): why, how long, and the requests it holds (its waiters). A run that moves by
    restart is a move (:func:`_moving_lines`), not listed here."""
    drained = [r for r in drained if not r.get("moving")]
    if not drained:
        return []
    lines = ["drained (the run stays: with a front, the next request starts the engine again; "
             "with none, it asks for its card again):"]
    for r in drained:
        waiters = r.get("waiters") or 0
        held = (f", {waiters} request(s) waiting" + (", asking for a card" if r.get("asking")
                                                     else "")) if waiters else ""
        front = f", front {r['front']}" if r.get("front") else \
            (", no front: asking for a card again" if r.get("asking") else ", no front")
        lines.append(f"    {r['engine']:<20} drained {format_duration(r['drained_s'])} ago"
                     f"{held}{front}")
        lines.append(f"        {r['why']}")
    return lines


def _size_words(sh: dict) -> str:
    """``"size 3.0GiB"``, or ``"ceiling 6.0GiB"`` for a lease whose bound is not declared (it
    counts what it needs, up to that size; issue 37)."""
    if sh.get("size_bytes") is None:
        return "size ?"
    word = "size" if sh.get("bound", "declared") == "declared" else f"{sh['bound']} bound, ceiling"
    return f"{word} {format_size(sh['size_bytes'])}"


def _until(le: dict) -> str:
    """`` · turn until 14:03:05 (8.00s) · keep_warm until 14:07:30 (4.5m)``: when the holder's
    protections end (``berth.daemon.status.protection``), each while it lasts; for an idle
    holder, why its turn keeps the card or not (`` · A yields at once: its client is waiting
    on B``, issue 34)."""
    out = f" · {le['demand']['why']}" if le.get("demand") else ""
    for key, label in (("turn", "turn"), ("keep_warm", "keep_warm")):
        left, at = le.get(f"{key}_left_s"), le.get(f"{key}_until")
        if left is None or at is None:
            continue
        out += (f" · {label} until {time.strftime('%H:%M:%S', time.localtime(at))} "
                f"({format_duration(left)})")
    return out


def _status(args) -> int:
    if args.watch is None:
        # One call: the standard library's client (aiohttp's import is most of this command's
        # start-up CPU; issue 38).
        st = client_sync.call("GET", "/v1/status")
        print(json.dumps(st, indent=2) if args.json else render(st), flush=True)
        return 0
    import asyncio
    startup.started()                   # a watch goes on: collect again
    return asyncio.run(_watch(args))


async def _watch(args) -> int:
    """Print the board every ``args.watch`` seconds until SIGINT, SIGTERM or SIGHUP (its
    terminal closed), then exit 0: on a terminal in place of the last one, else one after the
    other (JSON: a document a line). berthd gone meanwhile is said in place of the board, and
    the watch goes on."""
    import asyncio
    import contextlib
    import signal

    from berth.client import Client
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    tty = sys.stdout.isatty() and not args.json
    async with Client() as c:
        while not stop.is_set():
            try:
                st = await c.status()
                text = json.dumps(st) if args.json else render(st)
            except BerthdUnavailable as e:
                text = f"berth: {e} (watching: every {args.watch:g}s)"
            stamp = time.strftime("%H:%M:%S")
            if tty:
                text = f"\x1b[H\x1b[2J{stamp}  every {args.watch:g}s (Ctrl-C to stop)\n{text}"
            elif not args.json:
                text = f"--- {stamp}\n{text}"
            print(text, flush=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), args.watch)
    return 0


def _seconds(text: str) -> float:
    """``--watch``'s SECONDS: more than 0, at most an hour."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds more than 0 and at most 3600, like 2 or "
                                         f"0.5, got {text!r}")
    return v


def _operator(args) -> int:
    r = client_sync.call("POST", f"/v1/operator/{args.command}", {"target": args.target})
    if r.get("lease") is None and r.get("drained"):    # berth wake of a drained run (issue 35)
        print(f"{args.command} {r['engine']} (drained): " + "; ".join(r.get("notes", [])))
        return 0
    print(f"{args.command} {r['engine']} ({r['lease']})" +
          ("".join(f"\n  {n}" for n in r.get("notes", []))))
    return 0


def _run(fn):
    def go(args) -> int:
        try:
            return fn(args)
        except ConfigUnusable as e:    # the socket is in the config: say what is wrong with it
            print(f"berth: {e.error}", file=sys.stderr)
            return 2
        except BerthdUnavailable as e:
            print(f"berth: {e}", file=sys.stderr)
            return 3
        except ApiError as e:
            print(f"berth: {e.message}", file=sys.stderr)
            return 1
    return go


def status_arguments(p) -> None:
    """Fill ``berth status``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.add_argument("--json", action="store_true", help="the board as JSON: cards, leases, waiting, counters; the keys "
                   "each has are listed in docs/DESIGN.md (\"berth status --json\")")
    p.add_argument("--watch", nargs="?", const=2.0, type=_seconds, metavar="SECONDS",
                   help="print the board again every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=_run(_status))
    startup.keep_paused(p)          # one call, then it exits; a watch says started()


def operator_arguments(p) -> None:
    """Fill the parser of ``berth park|wake|drain|hold|release-hold`` (the command's name is
    the operator action; :data:`berth.cli.COMMANDS`)."""
    p.add_argument("target", metavar="LEASE_OR_ENGINE")
    p.set_defaults(func=_run(_operator))
    startup.keep_paused(p)          # one call, then it exits
