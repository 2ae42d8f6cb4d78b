"""A process that holds simulated card memory on command: a stowaway (no lease), or the stand-in
for an engine's load when a test drives a lease through the control API itself.

Run as ``python holder.py SIM_DIR``. Reads lines on stdin and answers one line each:
``alloc PCI BYTES`` -> ``ok`` or ``oom``; ``free`` -> ``ok`` (gives back everything it holds);
``exit`` ends it. Prints ``ready PID`` first."""

import sys

from berth.sim.cards import SimCards, SimOOM


def main() -> int:
    store = SimCards(sys.argv[1])
    import os
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "alloc":
            try:
                store.alloc(words[1], int(words[2]))
                print("ok", flush=True)
            except SimOOM:
                print("oom", flush=True)
        elif words[0] == "free":
            store.release()
            print("ok", flush=True)
        elif words[0] == "exit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
