"""CPU each Berth process spends to start, beside a bare Python (issue 38).

The test suite starts hundreds of Berth processes, and on a busy two-core machine its length is
their start-up CPU: interpreter start, imports, schema building. This script measures, for each
kind of process, the CPU seconds (user + system, of the process and of any child it waited for,
from ``os.wait4``) it spends from exec until it is doing its work:

- ``berthd``: ``berth daemon`` on one simulated card, until its socket answers ``GET /v1/health``,
  then SIGTERM (so its shutdown counts too);
- ``berth_run``: ``berth run --engine bench --front 127.0.0.1:P --health none -- sleep 600 {port}``
  against that berthd, until the front listens, then SIGTERM (the engine is coreutils' ``sleep``: its CPU
  is nil);
- ``berth_status``: ``berth status`` against the same berthd, to its exit;
- ``checkpoint_get_state``: ``berth-sim-cuda-checkpoint --get-state --pid P`` on a simulated
  engine, to its exit;
- ``sim_engine``: ``berth sim engine --port P --weights 1GiB`` until it listens, then SIGTERM;
- ``watchdog``: ``python -m berth.run.watchdog PGID START`` with its stdin closed, for an engine
  group already gone (as at the end of every ``berth run``), to its exit;
- ``python``: the reference, ``python -c pass``.

Cases alternate (one of each per round), so the machine's other load falls on each alike; a
first round, not counted, writes the bytecode (the children write it, as the tests' do).

    python bench/startup.py [--runs N] [--json]

Prints, per case, the median CPU in ms and its ratio to the reference; with ``--json`` the last
line is one JSON object: ``<case>_cpu_ms`` and ``<case>_over_python`` for each case, ``runs``,
``cpus`` and ``load1`` (the one-minute load average when the runs began).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_POLL_S = 0.005
_LIMIT_S = 60.0


def _free_port() -> int:
    """A free port below the ephemeral range (:func:`berth.sim.ports.free_ports`): a
    bind(0) port could be an outgoing connection's by the time its server binds it."""
    from berth.sim.ports import free_ports
    return free_ports()


def _script(name: str) -> str:
    """A console script beside this Python (as a user's PATH finds it)."""
    exe = Path(sys.executable).with_name(name)
    if not exe.exists():
        sys.exit(f"startup.py: no {exe}; install Berth into this Python's environment first")
    return str(exe)


def _cpu_s(pid: int) -> float:
    """Reap ``pid`` and return its user + system CPU seconds (its waited-for children too)."""
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_utime + usage.ru_stime


def _tcp_up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _health_up(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: berthd\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _until(argv: list[str], env: dict, up) -> float:
    """Exec ``argv``; once ``up()`` holds, SIGTERM it; return its CPU seconds."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    try:
        while not up():
            if proc.poll() is not None:
                raise SystemExit(f"startup.py: {argv[:3]} exited with {proc.returncode} early")
            if time.monotonic() - t0 > _LIMIT_S:
                raise SystemExit(f"startup.py: {argv[:3]} not up after {_LIMIT_S}s")
            time.sleep(_POLL_S)
    except BaseException:
        proc.kill()
        raise
    proc.send_signal(signal.SIGTERM)
    cpu = _cpu_s(proc.pid)
    proc.returncode = 0          # reaped above: Popen must not wait for it again
    return cpu


def _to_exit(argv: list[str], env: dict) -> float:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"startup.py: {argv[:3]} exited with {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def _setup(tmp: Path) -> tuple[dict, list[str]]:
    """The environment of every case, and berthd's command line."""
    # Children write their bytecode, as the tests' do (tests/conftest.py): else every start
    # would measure the compiler.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BERTH_") and k != "PYTHONDONTWRITEBYTECODE"}
    # As the tests' processes (tests/conftest.py): aiohttp's import-time SSL context reads an
    # empty bundle, not the system's (else each start measures the CA bundle's parsing).
    env.setdefault("SSL_CERT_FILE", os.devnull)
    env.update(BERTH_STATE_DIR=str(tmp / "state"), BERTH_SOCKET=str(tmp / "state" / "berthd.sock"),
               BERTH_SIM_DIR=str(tmp / "sim"), BERTH_CONFIG=str(tmp / "berth.toml"))
    (tmp / "berth.toml").write_text(
        f'state_dir = "{tmp / "state"}"\n[driver]\nkind = "sim"\nsim_dir = "{tmp / "sim"}"\n'
        '[[driver.cards]]\npci = "0000:01:00.0"\nname = "gpu0"\ntotal = "24GiB"\n'
        '[board]\nlisten = "off"\n[engines.bench]\nsize = "1GiB"\n')
    return env, [_script("berth"), "daemon", "--config", env["BERTH_CONFIG"]]


def _cases(env: dict, daemon: list[str], sock: Path, held_pid: int) -> dict:
    berth = _script("berth")
    # An engine group that is gone: the pid of an exited, reaped process.
    gone = subprocess.Popen(["true"])
    gone.wait()

    def berthd() -> float:
        # A second berthd on the same state dir would be refused: this one has its own.
        with tempfile.TemporaryDirectory(prefix="berth-startup-d-") as d:
            own, argv = _setup(Path(d))
            return _until(argv, own, lambda: _health_up(Path(own["BERTH_SOCKET"])))

    def berth_run() -> float:
        port = _free_port()
        return _until([berth, "run", "--engine", "bench", "--front", f"127.0.0.1:{port}",
                       "--health", "none", "--", "sleep", "600", "{port}"],
                      env, lambda: _tcp_up(port))

    def sim_engine() -> float:
        port = _free_port()
        return _until([berth, "sim", "engine", "--port", str(port), "--weights", "1GiB",
                       "--card", "gpu0"], env, lambda: _tcp_up(port))

    return {
        "berthd": berthd,
        "berth_run": berth_run,
        "berth_status": lambda: _to_exit([berth, "status"], env),
        "checkpoint_get_state": lambda: _to_exit(
            [_script("berth-sim-cuda-checkpoint"), "--get-state", "--pid", str(held_pid)], env),
        "sim_engine": sim_engine,
        "watchdog": lambda: _to_exit(
            [sys.executable, "-m", "berth.run.watchdog", str(gone.pid), "1.0"], env),
        "python": lambda: _to_exit([sys.executable, "-c", "pass"], env),
    }


def _measure(runs: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="berth-startup-") as tmp:
        env, daemon = _setup(Path(tmp))
        sock = Path(env["BERTH_SOCKET"])
        d = subprocess.Popen(daemon, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = _free_port()
        held = None
        try:
            t0 = time.monotonic()
            while not _health_up(sock):
                if d.poll() is not None or time.monotonic() - t0 > _LIMIT_S:
                    raise SystemExit("startup.py: berthd did not answer on its socket")
                time.sleep(_POLL_S)
            # An engine holding simulated memory, for --get-state to find.
            held = subprocess.Popen([_script("berth"), "sim", "engine", "--port", str(port),
                                     "--weights", "1GiB", "--card", "gpu0"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not _tcp_up(port):
                if held.poll() is not None or time.monotonic() - t0 > _LIMIT_S:
                    raise SystemExit("startup.py: the held engine did not listen")
                time.sleep(_POLL_S)
            cases = _cases(env, daemon, sock, held.pid)
            cpu: dict[str, list[float]] = {name: [] for name in cases}
            for case in cases.values():      # a first round, not counted, writes the bytecode
                case()
            for _ in range(runs):
                for name, case in cases.items():
                    cpu[name].append(case())
            return cpu
        finally:
            for p in (held, d):
                if p is not None:
                    p.terminate()
                    p.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="starts of each case (default 5)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args()
    if args.runs < 3:
        ap.error(f"--runs: at least 3 (a median of fewer says little), got {args.runs}")
    load1 = os.getloadavg()[0]
    cpu = _measure(args.runs)
    ref = statistics.median(cpu["python"])
    out: dict = {}
    for name, values in cpu.items():
        med = statistics.median(values)
        out[f"{name}_cpu_ms"] = round(med * 1000, 1)
        out[f"{name}_over_python"] = round(med / ref, 2) if ref > 0 else None
        print(f"{name:22} {med * 1000:8.1f} ms  {med / ref if ref else 0:6.2f} x python")
    out.update(runs=args.runs, cpus=os.cpu_count(), load1=round(load1, 2))
    print(f"runs {args.runs}, cpus {out['cpus']}, load1 {out['load1']}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
