"""Run as a second user by tests/daemon/test_socket_flood.py, with the system's Python and
nothing of Berth: open ``N`` idle connections to the Unix socket ``PATH`` (sending nothing),
print ``open K refused R`` once all were tried, hold them until stdin closes.

Usage: flooder.py PATH N"""

import resource
import socket
import sys

path, n = sys.argv[1], int(sys.argv[2])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        held.append(s)
    except OSError:
        refused += 1
        s.close()
print(f"open {len(held)} refused {refused}", flush=True)
sys.stdin.read()
