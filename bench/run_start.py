"""How fast ``berth run`` starts: from exec to its front listening, beside a bare Python.

llama-swap polls a model's health 250 ms after it starts the model's ``cmd`` (then every
second): a ``berth run`` whose front is not listening by that first poll costs a whole second
per switch (issue 30). This script execs ``berth run --front 127.0.0.1:PORT`` (berthd
unreachable, so the run fails open; the engine is a sleeping Python) and connects to PORT every
2 ms until it accepts; then it stops the run with SIGTERM. Beside it, the same
measurement for a bare Python that binds and listens (``python -c "...listen()"``), the floor
any Python program pays, and the time of ``berth --help`` and of ``python -c pass`` to exit.
``berth_run_engine_s`` goes on to the engine: from exec until the engine the run starts (a
Python that connects back here) is running; with berthd absent the run loads its config, the
plugins and aiohttp, fails to reach berthd, looks for a berthd that is starting (none), reads
the simulated card and fails open (the engine's 1 GiB from berth.toml's ``[engines.bench]``
fits), so this is the run's whole start but for the lease itself.
Runs alternate between the cases, so the machine's other load falls on each alike.

    python bench/run_start.py [--runs N] [--json]

Prints the medians in seconds; with ``--json`` the last line is one JSON object with keys
``berth_run_start_s_median``, ``berth_run_engine_s_median``, ``python_listen_s_median``, ``berth_help_s_median``,
``python_s_median``, ``berth_run_over_python_listen`` and ``berth_run_engine_over_python_listen``
(the ratios), ``runs``, ``cpus``, and
``load1`` (the machine's one-minute load average when the runs began). Target (issue 30):
``berth_run_start_s_median`` ≤ 0.2 s.
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

_POLL_S = 0.002
_LIMIT_S = 30.0


def _free_port() -> int:
    """A free port below the ephemeral range (:func:`berth.sim.ports.free_ports`): a
    bind(0) port could be an outgoing connection's by the time its server binds it."""
    from berth.sim.ports import free_ports
    return free_ports()


def _berth() -> str:
    """The ``berth`` console script beside this Python (as llama-swap execs it)."""
    exe = Path(sys.executable).with_name("berth")
    if not exe.exists():
        sys.exit(f"run_start.py: no {exe}; install Berth into this Python's environment first")
    return str(exe)


def _until_listening(argv: list[str], port: int, env: dict) -> float:
    """Exec ``argv``, return the seconds until 127.0.0.1:``port`` accepts, then stop it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    took = time.perf_counter() - t0
                    break
            if proc.poll() is not None:
                raise SystemExit(f"run_start.py: {argv[:3]} exited with {proc.returncode} "
                                 f"before listening")
            if time.perf_counter() - t0 > _LIMIT_S:
                raise SystemExit(f"run_start.py: {argv[:3]} not listening after {_LIMIT_S}s")
            time.sleep(_POLL_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return took


def _until_engine(argv: list[str], env: dict, hello: socket.socket) -> float:
    """Exec ``argv`` (a run whose engine connects to ``hello`` when it starts), return the
    seconds until the engine connects, then stop the run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        hello.settimeout(_LIMIT_S)
        conn, _ = hello.accept()
        took = time.perf_counter() - t0
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return took


def _until_exit(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def _cases(tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env.update(BERTH_STATE_DIR=tmp, BERTH_SOCKET=os.path.join(tmp, "absent.sock"),
               BERTH_CONFIG=os.path.join(tmp, "berth.toml"))
    Path(env["BERTH_CONFIG"]).write_text(          # a user's config: the run reads it
        '[driver]\nkind = "sim"\n[[driver.cards]]\npci = "0000:01:00.0"\nname = "gpu0"\n'
        'total = "24GiB"\n[engines.bench]\nsize = "1GiB"\n')
    berth = _berth()
    # The card exists, as a machine's does with berthd down (berthd declares simulated cards
    # at its start): a run fails open only where it reads the card and its engine's size fits.
    subprocess.run([berth, "sim", "init", "--card", "gpu0=24GiB@0000:01:00.0", "--dir",
                    os.path.join(tmp, "sim")], env=env, check=True, capture_output=True)
    engine = [sys.executable, "-c", "import time; time.sleep(600)", "{port}"]

    def run_start() -> float:
        port = _free_port()
        return _until_listening([berth, "run", "--engine", "bench", "--front",
                                 f"127.0.0.1:{port}", "--health", "none", "--", *engine],
                                port, env)

    def python_listen() -> float:
        port = _free_port()
        code = ("import socket, time; s = socket.socket(); "
                f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(600)")
        return _until_listening([sys.executable, "-c", code], port, env)

    hello = socket.socket()
    hello.bind(("127.0.0.1", 0))
    hello.listen()
    greet = ("import socket, time; socket.create_connection(('127.0.0.1', "
             f"{hello.getsockname()[1]})).close(); time.sleep(600)")

    def run_engine() -> float:
        return _until_engine([berth, "run", "--engine", "bench", "--front",
                              f"127.0.0.1:{_free_port()}", "--health", "none", "--",
                              sys.executable, "-c", greet, "{port}"], env, hello)

    return {"berth_run_start_s": run_start, "berth_run_engine_s": run_engine,
            "python_listen_s": python_listen,
            "berth_help_s": lambda: _until_exit([berth, "--help"], env),
            "python_s": lambda: _until_exit([sys.executable, "-c", "pass"], env)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="starts of each case (default 10)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args()
    if args.runs < 8:
        ap.error("--runs: at least 8 (a median of fewer says little on a shared machine)")
    load1 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="berth-run-start-") as tmp:
        cases = _cases(tmp)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, case in cases.items():
                times[name].append(case())
    out = {f"{name}_median": round(statistics.median(v), 4) for name, v in times.items()}
    out["berth_run_over_python_listen"] = round(
        out["berth_run_start_s_median"] / out["python_listen_s_median"], 2)
    out["berth_run_engine_over_python_listen"] = round(
        out["berth_run_engine_s_median"] / out["python_listen_s_median"], 2)
    out.update(runs=args.runs, cpus=os.cpu_count(), load1=round(load1, 2))
    for key, value in out.items():
        print(f"{key:32} {value}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
