"""The attacker's side, for the security tests: calls to berthd's socket and engine fronts run
as a second Unix user (``subprocess`` with ``user=``: setuid in the child), with the system's
Python and nothing of Berth imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.faults.conftest import as_user

ATTACKER = str(Path(__file__).with_name("attacker.py"))
HIJACKER = str(Path(__file__).with_name("hijacker.py"))
SYS_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def attack(user, d, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One call to berthd ``d``'s socket as ``user`` -> ``(status, JSON body)``."""
    args = [SYS_PY, ATTACKER, str(d.sock), method, path]
    if body is not None:
        args.append(json.dumps(body))
    out = as_user(user, args)
    assert out.returncode == 0, out.stderr
    status, _, text = out.stdout.strip().partition(" ")
    return int(status), json.loads(text)


class Hijacker:
    """:mod:`tests.security.hijacker` run as ``user``: a front on 127.0.0.1:``port`` that asks
    berthd for a lease of ``engine``. ``status``/``answer``: berthd's answer to the lease;
    ``hits()``: the requests that reached it (read once it is stopped)."""

    def __init__(self, user, d, engine: str, port: int, host: str = "127.0.0.1",
                 aliases: tuple[str, ...] = ()):
        self.proc = subprocess.Popen(
            [SYS_PY, HIJACKER, str(d.sock), engine, str(port), host, *aliases],
            user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline().split(" ", 2)
        assert first[0] == "lease", first + [self.proc.stderr.read()]
        self.status, self.answer = int(first[1]), json.loads(first[2])
        assert self.proc.stdout.readline().startswith("pid ")
        self._out: str | None = None

    def stop(self) -> str:
        if self._out is None:
            self.proc.kill()
            out, _ = self.proc.communicate(timeout=10)
            self._out = out
        return self._out

    def hits(self) -> list[str]:
        return [line for line in self.stop().splitlines() if line.startswith("hit ")]
