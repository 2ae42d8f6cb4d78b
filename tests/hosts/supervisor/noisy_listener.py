"""``berth supervisor listen`` with careless code inside: it prints to standard output on every
event, from both threads, right before the listener acknowledges. Started by supervisord in
test_non_ascii_stray_stdout_orphans; proves that the protocol's stdout is guarded."""

from __future__ import annotations

import os
import sys

from berth_hosts.supervisor import listener, protocol

_on_event = listener.Host.on_event
_ok = protocol.Protocol.ok


def _noisy_event(self, ev):
    print(f"stray print about {ev.name}")               # the asyncio thread, print()
    os.write(1, "stray os.write to fd 1 — ü\n".encode())
    return _on_event(self, ev)


def _noisy_ok(self):
    sys.stdout.write("stray write just before RESULT\n")  # the protocol thread, mid-cycle
    sys.stdout.flush()
    return _ok(self)


listener.Host.on_event = _noisy_event
protocol.Protocol.ok = _noisy_ok

if __name__ == "__main__":
    from berth.cli import main
    sys.exit(main(["supervisor", "listen", *sys.argv[1:]]))
