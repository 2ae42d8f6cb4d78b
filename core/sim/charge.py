"""``berth sim charge``: a real engine's memory, shown on the simulated cards.

Source: issue 30 ("the real engine's memory must show on the simulated card"); issue 3 (the
simulated cards); reference/park-mechanisms.md "After exit" (a driver frees a process's memory
only after it exits).

A real engine on CPU (llama.cpp's ``llama-server`` in the tests) allocates nothing on a simulated
card, so berthd's driver would see every card free and two engines that cannot share a card
would never need brokering. ``charge`` puts the engine's memory where the driver reads it::

    berth sim charge --size SIZE [--per-child SIZE] [--card CARD] [--dir D] -- CMD…
    berth-sim-charge …                       (the same, without the berth command's start-up)

1. It resolves the cards: ``--card``, else every card of ``$CUDA_VISIBLE_DEVICES`` (which
   ``berth run`` sets to the granted cards), else card 0, as the stub engine does.
2. It allocates ``SIZE`` on each for its own PID. A card without room is a simulated CUDA
   out-of-memory: the card's OOM counter rises, the message reads like CUDA's, and it exits 1
   without starting CMD, as an engine that fails to load.
3. With ``--per-child``, it forks a watcher first (detached from CMD's standard streams, so a
   manager that waits for them to close is not held up): every child CMD starts (llama.cpp's
   router runs each model in one) is charged ``SIZE`` while it lives. A child that does not fit
   is killed with SIGKILL, as a model load that runs out of memory ends.
4. It ``exec``s CMD in place: same PID, same start time, so the allocation stays on CMD's PID.

Every allocation lasts until its process exits, plus the store's free delay (the memory of a
process that ends goes free as a real driver frees it: after the exit). An unload in llama.cpp's
router ends the model's child, so a park by unload frees its memory the same way. Not followed:
llama.cpp's sleep (``--sleep-idle-seconds``), which frees memory inside a living process.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from berth.decide.units import parse_size
from berth.sim.cards import CardSpec, SimCards, SimError, SimOOM

__all__ = ["arguments", "run", "main", "visible_cards", "WATCH_EVERY_S"]

#: How often the watcher looks for new children of CMD (seconds).
WATCH_EVERY_S = 0.05


def visible_cards(store: SimCards, card: str | None) -> list[CardSpec]:
    """The cards to charge: ``card``, else those ``$CUDA_VISIBLE_DEVICES`` names (unset: card
    0). Raises ``ValueError`` for an empty ``CUDA_VISIBLE_DEVICES``, :class:`SimError` for a
    card the store does not have."""
    if card is not None:
        return [store.resolve(card)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    keys = ["0"] if visible is None else [k.strip() for k in visible.split(",") if k.strip()]
    if not keys:
        raise ValueError("card: CUDA_VISIBLE_DEVICES is empty, so no card is visible; give --card")
    return [store.resolve(k) for k in keys]


def _charge(store: SimCards, cards: list[CardSpec], nbytes: int, pid: int) -> None:
    """``nbytes`` on every card for ``pid``, all or none. Raises :class:`SimOOM`."""
    try:
        for spec in cards:
            store.alloc(spec.pci, nbytes, pid=pid, block=False)
    except SimOOM:
        store.release(pid)
        raise


def _alive(pid: int, start: float) -> bool:
    from berth.sim.store import start_time
    now = start_time(pid)
    return now is not None and abs(now - start) < 0.01


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid``: each of its threads' ``children`` file (a child started
    from any thread is listed under that thread), else one scan of ``/proc``."""
    if os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        found: list[int] = []
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return found
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    found += [int(w) for w in f.read().split()]
            except OSError:         # the thread ended meanwhile
                continue
        return found
    if not os.path.exists(f"/proc/{pid}"):
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: the fields follow the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(name))
    return found


def _watch(store: SimCards, cards: list[CardSpec], nbytes: int, parent: int,
           parent_start: float, skip: int) -> None:
    """Charge every child of ``parent`` but ``skip`` (the watcher's own parent, on its way out)
    while ``parent`` lives; SIGKILL one that does not fit."""
    charged: set[int] = set()
    while _alive(parent, parent_start):
        kids = set(_children(parent)) - {skip}
        for kid in kids - charged:
            try:
                _charge(store, cards, nbytes, kid)
            except SimOOM as e:
                print(f"berth sim charge: child {kid} of {parent}: {e}", file=sys.stderr)
                try:
                    os.kill(kid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            except SimError:
                pass        # gone before it could be charged
        charged = (charged | kids) & kids
        time.sleep(WATCH_EVERY_S)


def _detach_watcher(store: SimCards, cards: list[CardSpec], nbytes: int) -> None:
    """Fork the watcher as a grandchild (this process reaps the middle one, so CMD is never
    left with a child it did not start to reap). The watcher keeps CMD's process group, so a
    signal to the group (llama-swap's stop, ``berth run``'s kill) ends it too."""
    from berth.sim.store import start_time
    parent = os.getpid()
    parent_start = start_time(parent)
    middle = os.fork()
    if middle:
        os.waitpid(middle, 0)
        return
    try:
        middle = os.getpid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        _watch(store, cards, nbytes, parent, parent_start or 0.0, middle)
    finally:
        os._exit(0)


def arguments(p: argparse.ArgumentParser) -> None:
    """The ``berth sim charge`` flags."""
    p.add_argument("--size", required=True, metavar="SIZE",
                   help="memory CMD holds on each card while it lives, e.g. 3GiB")
    p.add_argument("--per-child", metavar="SIZE",
                   help="also charge SIZE to each child CMD starts (llama.cpp's router: one "
                        "child per loaded model), while that child lives")
    p.add_argument("--card", help="a PCI address, sim card name or UUID (default: every card "
                                  "of $CUDA_VISIBLE_DEVICES, else card 0)")
    p.add_argument("--dir", help="simulated cards directory (default $BERTH_SIM_DIR)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")


def run(args: argparse.Namespace) -> int:
    """Charge, then ``exec`` CMD (returns only on an error: 2 for bad input, 1 for an OOM, 127
    for a CMD that cannot be run)."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        if not cmd:
            raise ValueError("give the engine's command after --")
        size = parse_size(args.size, field="--size")
        child = parse_size(args.per_child, field="--per-child") if args.per_child else 0
        store = SimCards(args.dir)
        cards = visible_cards(store, args.card)
        _charge(store, cards, size, os.getpid())
    except (ValueError, SimError) as e:
        print(f"berth sim charge: {e}", file=sys.stderr)
        return 2
    except SimOOM as e:
        print(f"berth sim charge: {e}", file=sys.stderr)
        return 1
    if child:
        _detach_watcher(store, cards, child)
    sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        store.release(os.getpid())
        print(f"berth sim charge: cannot run {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    return 0   # not reached: exec replaced this process


def main() -> None:
    """Console entry point ``berth-sim-charge``."""
    p = argparse.ArgumentParser(prog="berth-sim-charge", description=__doc__.split("\n\n")[0])
    arguments(p)
    sys.exit(run(p.parse_args()))


if __name__ == "__main__":
    main()
