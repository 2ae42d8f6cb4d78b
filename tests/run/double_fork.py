"""An engine that daemonizes its server, for tests/run/test_subreaper.py (issue 36): it forks,
the child calls ``setsid()`` and forks again, the middle process exits, and the grandchild
``exec``s the command given (the server that holds the memory). The first process stays, as a
launcher does, until SIGTERM; then it leaves the daemon running (a daemon is not its child).

Usage: double_fork.py CMD..."""

import os
import signal
import sys

cmd = sys.argv[1:]
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp(cmd[0], cmd)
    os._exit(0)
os.waitpid(pid, 0)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    signal.pause()
