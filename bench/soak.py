"""Soak: load and faults together for N minutes against a real berthd on one simulated card.

Issue 18 ("bench/soak.py"). Three ``berth run`` engines (10 GiB leases, 9 GiB of weights, park
by the stand-in cuda-checkpoint) share one simulated 24 GiB card, so at most two fit and every
request to the third forces a switch. Clients (``--clients``, default 64) send chats through the
three fronts, each with a deadline (``--deadline``, default 60 s). Every ``--switch-every``
seconds (default 3) an operator park forces a switch; every ``--fault-every`` seconds (default
20) a fault lands, in turn: berthd killed with SIGKILL and restarted, an engine process killed
with SIGKILL (its run ends; it is started again, as llama-swap would), and an operator drain of
an engine (started again). Any other run that ends (a fallback drain when a park overruns
under load) is started again too. ``--no-faults``: load and forced switches only.

A request ends in one of: ``answered`` (200 with tokens), a 503 with a reason (counted by
reason), ``other`` (by kind: another status; ``connect``, a refused connection, expected while
an engine's run is down; ``engine_killed``, a 502 for a request in flight to an engine the soak
SIGKILLed, or a connection its run closed as it went down for it; ``dropped``, any other
connection closed with no answer), or a hang (no answer before its
deadline). The card's OOM counter is read at the end.
RSS growth: berthd's from 5 s after each start to the end of that life (the largest), and each
front's (``berth run``, which serves the front) from when its run first says its engine serves
(not from its start: a new run's import ramp is not growth) to the end of its life, for runs that
served for 5 s or more (the largest).

    python bench/soak.py [--minutes N] [--json] [--clients C] [--no-faults]
                         [--faults-at-least N]

With ``--json`` the last line is one JSON object: ``minutes``, ``ran_s``, ``requests_sent``, ``answered``,
``refused_503`` (reason -> count), ``other`` (kind -> count), ``hangs``, ``oom_events``,
``faults`` (kind -> count), ``switches``, ``runs_restarted`` (runs that ended on their own,
e.g. by a fallback drain, and were started again), ``runs_killed`` (runs still up 30 s after
an engine fault or a drain, killed with SIGKILL: their fronts' requests are dropped),
``p99_hold_s``, ``berthd_rss_growth_mib``,
``fronts_rss_growth_mib``, ``cpus`` and ``load_avg`` (the machine's 1-minute load at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
from berth.sim.ports import free_ports

BIN = Path(sys.executable).parent
BERTH = str(BIN / "berth")
CHECKPOINT = str(BIN / "berth-sim-cuda-checkpoint")
ENGINES = ("A", "B", "C")
MiB = 1 << 20


#: Lines of each run's log a failed start shows (the soak's directory is gone by then).
LOG_TAIL = 15


class SoakFailed(RuntimeError):
    """The soak could not go on (berthd or the engines did not come up); the message says
    why, with what the processes logged."""


def _tail(path: Path, since: int = 0, lines: int = LOG_TAIL) -> str:
    """The last ``lines`` lines of ``path`` from byte ``since`` on, each cut to 300
    characters, indented; "(no log)" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line[:300] for line in text.splitlines()[-lines:]) or "    (empty)"


def _http(sock: Path, method: str, path: str, body: dict | None = None,
          timeout: float = 10) -> tuple[int, dict]:
    import http.client

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(sock))
    c = Conn("localhost", timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data,
                  headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        c.close()


class Soak:
    def __init__(self, tmp: Path, clients: int, deadline_s: float):
        self.tmp = tmp
        self.clients = clients
        self.deadline_s = deadline_s
        self.sock = tmp / "state" / "berthd.sock"
        self.config = tmp / "berth.toml"
        # release_grace 10 s: on a loaded two-core machine the stand-in checkpoint's start alone
        # took over a second, and a park cut short falls back to a drain (a run down, refused
        # connections) where the load test wants every request answered.
        self.config.write_text(
            f'state_dir = "{tmp / "state"}"\n[driver]\nkind = "sim"\nsim_dir = "{tmp / "sim"}"\n'
            'free_delay = "0.5s"\ncheckpoint_rate = "70GB"\n'
            '[[driver.cards]]\npci = "0000:01:00.0"\nname = "gpu0"\ntotal = "24GiB"\n'
            '[cards.gpu0]\nreserve = "1GiB"\n[board]\nlisten = "off"\n'
            '[policy]\nmin_turn = "0s"\n'
            'ram_budget = "64GiB"\nrelease_grace = "10s"\nread_interval = "0.2s"\n')
        self.env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"),
                    "BERTH_SOCKET": str(self.sock), "BERTH_SIM_DIR": str(tmp / "sim"),
                    "BERTH_CONFIG": str(self.config), "PYTHONUNBUFFERED": "1"}
        self.berthd: subprocess.Popen | None = None
        self.runs: dict[str, tuple[subprocess.Popen, int]] = {}
        self.log_at: dict[int, int] = {}      # run pid -> its log's size when it started
        self.serving: set[int] = set()        # run pids whose engine has served
        self.lock = threading.Lock()
        self.sent = self.answered = self.hangs = 0
        self.refused: dict[str, int] = {}
        self.other: dict[str, int] = {}
        self.holds: list[float] = []
        self.faults: dict[str, int] = {}
        self.switches = 0
        self.restarts = 0
        self.runs_killed = 0      # runs still up 30 s after their fault, killed with SIGKILL
        self.engine_kills: dict[str, list[float]] = {}     # engine -> when the soak killed it
        self.rss: dict[int, tuple[float, int]] = {}      # pid -> (first sample's time, bytes)
        self.growth: dict[str, float] = {"berthd": 0.0, "fronts": 0.0}
        self.stop = threading.Event()

    # -- processes --------------------------------------------------------------------------
    def start_berthd(self) -> None:
        if self.sock.exists():
            self.sock.unlink()
        self.berthd = subprocess.Popen([BERTH, "daemon", "--config", str(self.config)],
                                       env=self.env, stdout=open(self.tmp / "berthd.log", "ab"),
                                       stderr=subprocess.STDOUT)
        self._until(lambda: self._api("GET", "/v1/health")[0] == 200, 30, "berthd up",
                    lambda: "berthd's log:\n" + _tail(self.tmp / "berthd.log"))

    def start_run(self, engine: str) -> None:
        # Below the ephemeral range: a bind(0) port could be another connection's by the time
        # the run binds its front on it (CI, the whole suite on a loaded machine).
        port = self.runs[engine][1] if engine in self.runs else free_ports()
        argv = [BERTH, "run", "--engine", engine, "--front", f"127.0.0.1:{port}", "--size",
                "10GiB", "--park", "checkpoint", "--checkpoint-path", CHECKPOINT, "--",
                BERTH, "sim", "engine", "--port", "{port}", "--weights", "9GiB", "--load-s",
                "0.1", "--model", engine]
        log = self.tmp / f"run-{engine}.log"
        at = log.stat().st_size if log.exists() else 0
        p = subprocess.Popen(argv, env=self.env, stdout=open(log, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.runs[engine] = (p, port)
        self.log_at[p.pid] = at

    def _serves(self, engine: str, p: subprocess.Popen) -> bool:
        """Has this run (not an earlier one of the engine) said its engine serves?"""
        if p.pid in self.serving:
            return True
        with open(self.tmp / f"run-{engine}.log", "rb") as f:
            f.seek(self.log_at.get(p.pid, 0))
            if b" is serving" in f.read():
                self.serving.add(p.pid)
                return True
        return False

    def _api(self, method: str, path: str, body: dict | None = None,
             timeout: float = 10) -> tuple[int, dict]:
        try:
            return _http(self.sock, method, path, body, timeout)
        except OSError:
            return 0, {}

    def _until(self, pred, timeout: float, what: str, why=None):
        """Poll ``pred()`` until truthy (returned). :class:`SoakFailed` after ``timeout``
        seconds, naming ``what``, with ``why()``'s account (a string) when given."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = pred()
            if v:
                return v
            time.sleep(0.05)
        raise SoakFailed(f"timed out after {timeout:g} s waiting for {what}"
                         + (f"\n{why()}" if why is not None else ""))

    def not_up(self) -> str:
        """Why the engines are not all up: each one's lease state at berthd (or none), its run's
        process (running, or its exit code) and front port, and the tail of its run's log."""
        states = self.states()
        answers = self._api("GET", "/v1/health", timeout=5)[0] == 200
        out = [] if answers or self.berthd is None else [
            "berthd does not answer (its process: " + ("running" if self.berthd.poll() is None
                                                        else f"exited {self.berthd.returncode}")
            + "); its log:",
            _tail(self.tmp / "berthd.log")]
        for e in ENGINES:
            p, port = self.runs.get(e, (None, None))
            state = states.get(e)
            up = "up" if state in ("active", "parked") else "not up"
            proc = "not started" if p is None else (
                f"running (pid {p.pid})" if p.poll() is None else f"exited {p.returncode}")
            lease = f"lease {state}" if state else "no lease"
            out.append(f"{e}: {up}, {lease}, run {proc}, front 127.0.0.1:{port}; its log:")
            out.append(_tail(self.tmp / f"run-{e}.log", self.log_at.get(p.pid, 0) if p else 0))
        return "\n".join(out)

    def states(self) -> dict[str, str]:
        code, st = self._api("GET", "/v1/status")
        if code != 200:
            return {}
        return {le["engine"]: "/".join(s["state"] for s in le["shares"]) for le in st["leases"]}

    # -- load ------------------------------------------------------------------------------
    def client(self, seed: int) -> None:
        rnd = random.Random(seed)
        while not self.stop.is_set():
            engine = rnd.choice(ENGINES)
            port = self.runs[engine][1]
            self.one(port, engine)

    def one(self, port: int, engine: str) -> None:
        body = json.dumps({"model": engine, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        kind = None
        try:
            with urllib.request.urlopen(req, timeout=self.deadline_s) as r:
                data = json.loads(r.read())
                kind = "ok" if data.get("usage", {}).get("completion_tokens", 0) > 0 else "200 empty"
        except urllib.error.HTTPError as e:
            raw, plain = e.read() or b"{}", ""
            try:
                data = json.loads(raw)
                msg = data.get("error", {}).get("message", "")
            except (ValueError, AttributeError):
                msg = ""
                text = raw.decode(errors="replace").strip().splitlines()
                plain = "plain: " + (text[0] if text else "")   # aiohttp's own 500 is text
            kind = ("503:" + msg.split(":")[0][:50]) if e.code == 503 and msg else str(e.code)
            if e.code not in (502, 503) and (msg or plain):
                kind += ": " + (msg or plain)[:80]   # a failure's report says what answered it
        except (TimeoutError, socket.timeout):
            kind = "hang"
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", e)
            if isinstance(why, (TimeoutError, socket.timeout)):
                kind = "hang"
            elif isinstance(why, ConnectionRefusedError):
                kind = "connect"        # no front listens: its run is down (an engine fault)
            else:
                kind = "dropped"        # a front took the request and closed without an answer
        held = time.monotonic() - t0
        if kind in ("502", "dropped") and self._killed_under(engine, t0, t0 + held):
            # In flight to an engine the soak SIGKILLed (its 502), or sent as its run went
            # down for it (a broken pipe 0.3 s after the kill, seen under a CPU load of 4).
            kind = "engine_killed"
        with self.lock:
            self.sent += 1
            self.holds.append(held)
            if kind == "ok":
                self.answered += 1
            elif kind == "hang":
                self.hangs += 1
            elif kind.startswith("503:"):
                self.refused[kind[4:]] = self.refused.get(kind[4:], 0) + 1
            else:
                self.other[kind] = self.other.get(kind, 0) + 1
        if kind == "connect":
            time.sleep(0.2)          # the front is down (an engine fault): do not spin

    def _killed_under(self, engine: str, t0: float, t1: float) -> bool:
        """Whether the soak SIGKILLed ``engine`` while a request from ``t0`` to ``t1`` was in
        flight, or shortly before it came (its front answers 502 until its run exits)."""
        with self.lock:
            return any(k <= t1 and t0 <= k + 35.0 for k in self.engine_kills.get(engine, ()))

    # -- switches, faults, RSS -----------------------------------------------------------------
    def switcher(self, every: float) -> None:
        while not self.stop.wait(every):
            active = [e for e, s in self.states().items() if s == "active"]
            if active:
                # Each park in its own thread: one that answers late (a busy engine) must not
                # hold the next switch back.
                threading.Thread(target=self._park, args=(random.choice(active),),
                                 daemon=True).start()

    def _park(self, engine: str) -> None:
        code, _ = self._api("POST", "/v1/operator/park", {"target": engine}, timeout=45)
        with self.lock:
            self.switches += code == 200

    def fault(self, n: int) -> None:
        kind = ("berthd_sigkill", "engine_sigkill", "drain")[n % 3]
        self.faults[kind] = self.faults.get(kind, 0) + 1
        if kind == "berthd_sigkill":
            self.sample_rss(final=True)
            self.berthd.send_signal(signal.SIGKILL)
            self.berthd.wait(10)
            self.start_berthd()
            return
        engine = random.choice(ENGINES)
        run, _ = self.runs[engine]
        if kind == "engine_sigkill":
            with self.lock:
                self.engine_kills.setdefault(engine, []).append(time.monotonic())
            for c in psutil.Process(run.pid).children(recursive=True):
                try:
                    if "engine" in c.cmdline():
                        c.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
        else:
            self._api("POST", "/v1/operator/drain", {"target": engine})
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            # Its front's connections end unanswered ("dropped"): counted apart, as a fault.
            self.runs_killed += 1
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(5)
        self.start_run(engine)

    def sample_rss(self, final: bool = False) -> None:
        # A front counts from when it serves: sampled from its start, the figure was the
        # import ramp of a new run (issue 26), not growth.
        procs = [("berthd", self.berthd)] + [("fronts", r) for e, (r, _) in self.runs.items()
                                             if self._serves(e, r)]
        now = time.monotonic()
        for group, p in procs:
            try:
                rss = psutil.Process(p.pid).memory_info().rss
            except psutil.Error:
                continue
            first = self.rss.get(p.pid)
            if first is None:
                self.rss[p.pid] = (now, rss)
            elif now - first[0] >= 5:
                self.growth[group] = max(self.growth[group], (rss - first[1]) / MiB)
        if final:
            self.rss.pop(self.berthd.pid, None)

    def run(self, minutes: float, faults: bool, switch_every: float, fault_every: float,
            at_least: int = 0) -> dict:
        self.start_berthd()
        for e in ENGINES:
            self.start_run(e)
        self._until(lambda: sum(s in ("active", "parked") for s in self.states().values()) == 3,
                    60, "three engines up", self.not_up)
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                   for i in range(self.clients)]
        threads.append(threading.Thread(target=self.switcher, args=(switch_every,), daemon=True))
        for t in threads:
            t.start()
        end = time.monotonic() + minutes * 60
        next_fault = time.monotonic() + min(fault_every, max(minutes * 60 / 3, 1))
        warm = time.monotonic() + 5
        n = 0
        # --faults-at-least: on a loaded machine a fault (a restart, a run's exit) takes long;
        # the load goes on past N minutes until that many have landed.
        while time.monotonic() < end or (faults and n < at_least):
            time.sleep(0.5)
            owed = faults and n < at_least
            if time.monotonic() >= warm:
                self.sample_rss()
            # A run that ended on its own (a fallback drain under load, an engine that died)
            # is started again, as llama-swap or a service manager would: the load goes on.
            for e, (p, _) in list(self.runs.items()):
                if p.poll() is not None and (end - time.monotonic() > 5 or owed):
                    self.restarts += 1
                    self.start_run(e)
            if faults and time.monotonic() >= next_fault and (end - time.monotonic() > 5
                                                              or owed):
                self.fault(n)
                n += 1
                next_fault = time.monotonic() + fault_every
        self.sample_rss()
        self.stop.set()
        for t in threads:
            t.join(self.deadline_s + 10)
        from berth.sim.cards import SimCards
        oom = sum(c.oom_events for c in SimCards(self.tmp / "sim").snapshot().cards)
        holds = sorted(self.holds)
        return {"minutes": minutes, "ran_s": round(time.monotonic() - end + minutes * 60, 1),
                "requests_sent": self.sent, "answered": self.answered,
                "refused_503": self.refused, "other": self.other, "hangs": self.hangs,
                "still_running": sum(t.is_alive() for t in threads),
                "oom_events": oom, "faults": self.faults, "switches": self.switches,
                "runs_restarted": self.restarts, "runs_killed": self.runs_killed,
                "p99_hold_s": round(holds[int(len(holds) * 0.99) - 1], 3) if holds else None,
                "berthd_rss_growth_mib": round(self.growth["berthd"], 2),
                "fronts_rss_growth_mib": round(self.growth["fronts"], 2),
                "cpus": os.cpu_count(), "load_avg": round(os.getloadavg()[0], 2)}

    def close(self) -> None:
        self.stop.set()
        for p, _ in self.runs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if self.berthd and self.berthd.poll() is None:
            self.berthd.terminate()
            try:
                self.berthd.wait(15)
            except subprocess.TimeoutExpired:
                self.berthd.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--deadline", type=float, default=60.0)
    ap.add_argument("--switch-every", type=float, default=3.0)
    ap.add_argument("--fault-every", type=float, default=20.0)
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--faults-at-least", type=int, default=0, metavar="N",
                    help="go on past --minutes until N faults have landed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args(argv)
    # SIGTERM (a test's timeout) must still end berthd and the runs: they are not our group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="berth-soak-"))
    soak = Soak(tmp, a.clients, a.deadline)
    try:
        out = soak.run(a.minutes, not a.no_faults, a.switch_every, a.fault_every,
                       a.faults_at_least)
    except SoakFailed as e:
        print(f"soak: {e}", file=sys.stderr)
        return 1
    finally:
        soak.close()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24} {v}")
    return 0 if out["hangs"] == 0 and out["oom_events"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
