"""A parent for ``berth run`` that, like a container's init or a service manager, adopts
orphans (``PR_SET_CHILD_SUBREAPER``) but reaps nothing until told: an engine's leader killed
with its run then stays a zombie with its PID and start time, the case issue 18 hole 1 found.

    python reaper.py CMD...     prints the child's pid, then waits for EOF on stdin
"""

import ctypes
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main():
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    p = subprocess.Popen(sys.argv[1:], start_new_session=True)
    print(p.pid, flush=True)
    sys.stdin.read()                    # the test is done: exit; init reaps the rest


if __name__ == "__main__":
    main()
