"""Drive one model's ``cmd`` exactly as llama-swap does (reference/llama-swap.md, commit 0bdb372).

- **Parsing** (``internal/config/commands.go``, ``macros.go``): ``${PORT}`` is put in place in the
  ``cmd`` text, then the text is split into argv with POSIX shlex rules.
- **Start** (``internal/process/process_command.go``, ``runtime_unix.go``): ``argv[0]`` is exec'd
  without a shell, as the leader of its own process group (``Setpgid``: pgid = pid).
- **Readiness**: wait 250 ms, then ``GET http://127.0.0.1:${PORT}<checkEndpoint>`` every second
  until it answers 200; refused connections and non-200 answers are retried. The start fails when
  the process exits early or when ``healthCheckTimeout`` runs out (the group is then killed).
- **Stop** (``killProcess`` without ``cmdStop``): SIGTERM to the process group, wait up to the
  graceful timeout (``unloadTimeout``, 10 s) for the ``cmd`` process to exit, then SIGKILL to the
  whole group, then reap.

The class is synchronous (tests call it from plain pytest functions) and keeps no state beyond the
process, so a fixture can always :meth:`LlamaSwapModel.kill` it on the way out.
"""

from __future__ import annotations

import http.client
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LlamaSwapModel", "StartFailed", "Stopped", "HEALTH_FIRST_DELAY_S",
           "HEALTH_INTERVAL_S", "UNLOAD_TIMEOUT_S"]

#: llama-swap waits this long after the spawn before its first health check (seconds).
HEALTH_FIRST_DELAY_S = 0.25
#: ... then checks once per second.
HEALTH_INTERVAL_S = 1.0
#: The graceful-stop timeout for TTL/API/manual unloads (``unloadTimeout``, seconds).
UNLOAD_TIMEOUT_S = 10.0


class StartFailed(AssertionError):
    """The ``cmd`` exited before it was ready, or ``healthCheckTimeout`` ran out."""


@dataclass(frozen=True)
class Stopped:
    """How a stop ended: the ``cmd`` process's exit code (negative: killed by that signal), the
    seconds from the SIGTERM to the exit, and whether the group had to be SIGKILLed."""

    exit_code: int
    elapsed_s: float
    killed: bool


class LlamaSwapModel:
    """One llama-swap model. ``cmd`` is the config's ``cmd`` text (``${PORT}`` expanded here, as
    llama-swap does at config load); ``port`` is the ``${PORT}`` llama-swap assigned; ``env`` is
    llama-swap's environment (its ``env`` entries included); ``log`` receives stdout and stderr."""

    def __init__(self, name: str, cmd: str, *, port: int, env: dict[str, str], log: Path,
                 check_endpoint: str = "/health", health_check_timeout_s: float = 120.0,
                 unload_timeout_s: float = UNLOAD_TIMEOUT_S):
        self.name = name
        self.port = port
        self.argv = shlex.split(cmd.replace("${PORT}", str(port)), posix=True)
        self.env = env
        self.log = log
        self.check_endpoint = check_endpoint
        self.health_check_timeout_s = health_check_timeout_s
        self.unload_timeout_s = unload_timeout_s
        self.proc: subprocess.Popen | None = None
        self.health_checks = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def url(self) -> str:
        """llama-swap's ``proxy`` default: where it sends the model's requests."""
        return f"http://127.0.0.1:{self.port}"

    # -- start ------------------------------------------------------------------------------------
    def spawn(self) -> "LlamaSwapModel":
        """Exec the argv without a shell, leading its own process group (``Setpgid``)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         process_group=0)
        return self

    def wait_ready(self) -> float:
        """llama-swap's readiness loop. Returns the seconds from the first check to the 200.
        Raises :class:`StartFailed` (after killing the group, as llama-swap does)."""
        assert self.proc is not None
        if self.check_endpoint == "none":
            return 0.0
        spawned = time.monotonic()
        deadline = spawned + self.health_check_timeout_s
        time.sleep(HEALTH_FIRST_DELAY_S)
        first = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise StartFailed(f"{self.name}: cmd exited with {self.proc.returncode} before "
                                  f"it was ready; log {self.log}")
            tick = time.monotonic()
            self.health_checks += 1
            if self.health() == 200:
                return time.monotonic() - first
            if tick >= deadline:
                self.kill()
                raise StartFailed(f"{self.name}: no 200 on {self.check_endpoint} within "
                                  f"healthCheckTimeout ({self.health_check_timeout_s:g} s)")
            time.sleep(max(0.0, tick + HEALTH_INTERVAL_S - time.monotonic()))

    def start(self) -> float:
        """:meth:`spawn` then :meth:`wait_ready`."""
        return self.spawn().wait_ready()

    def health(self) -> int | None:
        """One health check: the HTTP status, or ``None`` when the connection failed."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", self.check_endpoint)
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    # -- stop -------------------------------------------------------------------------------------
    def stop(self) -> Stopped:
        """``killProcess`` without ``cmdStop``: SIGTERM to the group, wait up to the unload
        timeout for the ``cmd`` process, then SIGKILL to the group; reap."""
        assert self.proc is not None
        t0 = time.monotonic()
        killed = False
        if self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.unload_timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
                _killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return Stopped(self.proc.returncode, time.monotonic() - t0, killed)

    def kill(self) -> None:
        """Cleanup: SIGKILL the group and reap (harmless when already gone)."""
        if self.proc is None or self.proc.poll() is not None:
            return      # reaped: its group id may belong to someone else by now
        _killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
