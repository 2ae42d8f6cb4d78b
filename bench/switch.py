"""What a switch costs beyond its mechanisms: a write arriving at a parked engine's front.

The setting of ``berth demo`` (issues 5 and 12): a berthd on one simulated 12 GiB card (1 GiB
reserve) in a simulated host of 24 GiB RAM, two stub engines of 5.5 GiB weights under
``berth run --size 6GiB --park checkpoint``, so that one is always parked in (simulated) host
RAM. The policy is the default, nothing turned off (issue 34: defaults are the product): one
client alternates, so the holder's last answer went to the client now waiting on the other
engine, and it yields at once (no rent, no minimum turn for an engine with no demand, no juggle
guard between engines of which only one has work). Each switch sends one streamed chat to the
parked engine's front and times, from the moment the request is sent:

- ``ttfb``: the first byte of the answer (the status line; the stub engine writes its first
  chunk at once, so this is the switch, not generation);
- ``restore``: the wall time of every cuda-checkpoint call on the woken engine (``--get-state``,
  ``restore``, ``unlock``), as the run waits on it;
- ``park``: the wall time of every cuda-checkpoint call on the other engine (``--get-state``,
  ``lock``, ``checkpoint``): the card has room for one engine only, so every switch makes room.

The calls are timed by a shim put in place of the tool (``--checkpoint-path``): a shell script
that notes the wall clock around each call of the stand-in ``berth-sim-cuda-checkpoint`` and its
exit code. Reported per switch and as median / p90:

- ``overhead_ms`` = ttfb − restore − park: Berth's own time, *excluding the mechanisms' own
  time*: the front holding the write and asking berthd, berthd's scheduling, the instructions
  reaching both runs (long-poll), the front of the parked-to-be engine closing, the driver reads
  that confirm the park (rule 1), the health probe after the restore, opening the front and
  forwarding. Target (issue 5): median ≤ 100 ms.
- ``overhead_incl_room_ms`` = ttfb − restore: the same *including making room* (the other
  engine's checkpoint).

The mechanism times include what the stand-in costs that a real cuda-checkpoint would not: each
call is a Python process (start-up ≈ 0.1–0.2 s) around a data move modelled at a fixed rate
(``--rate`` bytes/s, default 7e9 as in the demo; ``move_ms`` reports bytes / rate). They are
subtracted whole, start-up included: it belongs to the tool, not to Berth. A breakdown from
berthd's timeline (monotonic ``at``, same clock as the shim's) shows where the overhead goes.

    python bench/switch.py [--json] [-n N] [--rate BYTES_PER_S] [--keep]

``-n``: switches timed (default 10), after one untimed warm-up switch. With ``--json`` the last
line is one JSON object: ``overhead_ms_median``, ``overhead_ms_p90``,
``overhead_incl_room_ms_median``, ``overhead_incl_room_ms_p90``, ``ttfb_ms_median``,
``ttfb_ms_p90``, ``restore_tool_ms_median``, ``park_tool_ms_median``, ``move_ms_median``,
``breakdown_ms_median`` (stage -> ms), ``target_ms``, ``n``, ``rate_bytes_per_s``, ``cpus`` and
``switches`` (every switch's figures).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from berth.demo import CONFIG  # the demo's card, reserve and simulated host RAM

BIN = Path(sys.executable).parent
BERTH = str(BIN / "berth")
TOOL = str(BIN / "berth-sim-cuda-checkpoint")
TARGET_MS = 100.0

SHIM = """\
#!/bin/sh
# Times one call of the stand-in cuda-checkpoint: start and end (ns, wall clock), exit code, args.
t0=$(date +%s%N)
{tool} "$@"
rc=$?
t1=$(date +%s%N)
echo "$t0 $t1 $rc $*" >> {log}
exit $rc
"""


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _free_port() -> int:
    """A free port below the ephemeral range (:func:`berth.sim.ports.free_ports`): a
    bind(0) port could be an outgoing connection's by the time its server binds it."""
    from berth.sim.ports import free_ports
    return free_ports()


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


class Bench:
    def __init__(self, tmp: Path, rate: float):
        self.tmp, self.rate = tmp, rate
        self.sock = str(tmp / "state" / "berthd.sock")
        self.env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"), "BERTH_SOCKET": self.sock,
                    "BERTH_SIM_DIR": str(tmp / "sim"), "BERTH_CONFIG": str(tmp / "berth.toml"),
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("BERTH_SIM_CHECKPOINT_BPS", None)     # the rate is the config's
        self.procs: list[subprocess.Popen] = []
        self.ports = {"A": _free_port(), "B": _free_port()}
        self.calls = tmp / "checkpoint-calls.log"
        # time.time() - time.monotonic(): the shim's wall clock to berthd's monotonic "at"
        self.offset = time.time() - time.monotonic()

    # -- processes --------------------------------------------------------------------------------
    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        with open(self.tmp / log, "ab") as out:
            p = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self) -> None:
        # The demo's config as it is: its [policy] is the default one.
        (self.tmp / "berth.toml").write_text(CONFIG.format(tmp=self.tmp, rate=int(self.rate)))
        shim = self.tmp / "cuda-checkpoint-shim"
        shim.write_text(SHIM.format(tool=TOOL, log=self.calls))
        shim.chmod(0o755)
        self._spawn([BERTH, "daemon"], "berthd.log")
        self._until(lambda: self._api("GET", "/v1/health")[0] == 200, 20, "berthd")
        for name in ("A", "B"):
            self._spawn([BERTH, "run", "--engine", name, "--front",
                         f"127.0.0.1:{self.ports[name]}", "--size", "6GiB", "--park",
                         "checkpoint", "--checkpoint-path", str(shim), "--",
                         BERTH, "sim", "engine", "--port", "{port}", "--weights", "5.5GiB",
                         "--load-s", "1", "--kv-per-token", "1MiB", "--model", name],
                        f"run-{name}.log")
            self._until(lambda n=name: self._state(n) == ("active", True), 60, f"{name} serving")
        self._until(lambda: self._state("A")[0] == "parked", 60, "A parked for B")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    # -- berthd -----------------------------------------------------------------------------------
    def _api(self, method: str, path: str) -> tuple[int, dict]:
        c = _Unix(self.sock)
        try:
            c.request(method, path)
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"{}")
        except OSError:
            return 0, {}
        finally:
            c.close()

    def _status(self) -> dict:
        return self._api("GET", "/v1/status")[1]

    def _state(self, engine: str) -> tuple[str | None, bool]:
        for le in self._status().get("leases", []):
            if le["engine"] == engine:
                return le["shares"][0]["state"], le["ready"]
        return None, False

    def _pid(self, engine: str) -> int:
        return next(le["pid"] for le in self._status()["leases"] if le["engine"] == engine)

    def _timeline(self, after: int) -> list[dict]:
        return self._api("GET", f"/v1/timeline?after={after}")[1]["entries"]

    @staticmethod
    def _until(pred, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.05)
        raise RuntimeError(f"bench/switch: timed out waiting for {what}")

    # -- one switch -------------------------------------------------------------------------------
    def _calls(self, t0: float, t1: float) -> list[dict]:
        out = []
        if not self.calls.exists():
            return out
        for line in self.calls.read_text().splitlines():
            a, b, rc, *args = line.split()
            start, end = int(a) / 1e9, int(b) / 1e9
            if start >= t0 and end <= t1:
                pid = int(args[args.index("--pid") + 1])
                what = args[args.index("--action") + 1] if "--action" in args else args[0]
                out.append({"start": start, "end": end, "rc": int(rc), "pid": pid, "what": what})
        return out

    def _host_bytes(self, pid: int) -> tuple[int, int]:
        """(bytes on the card, bytes in host RAM) of ``pid`` on the simulated cards."""
        from berth.sim.cards import SimCards
        for p in SimCards(self.tmp / "sim").snapshot().procs:
            if p.pid == pid:
                return sum(p.card.values()), sum(p.host.values())
        return 0, 0

    def switch(self, target: str) -> dict:
        other = "B" if target == "A" else "A"
        assert self._state(target)[0] == "parked" and self._state(other)[0] == "active"
        tpid, opid = self._pid(target), self._pid(other)
        moved = self._host_bytes(tpid)[1] + self._host_bytes(opid)[0]
        seq = max((e["seq"] for e in self._timeline(0)), default=0)
        body = json.dumps({"model": target, "stream": True, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
               f"Connection: close\r\n\r\n").encode() + body
        s = socket.create_connection(("127.0.0.1", self.ports[target]), timeout=120)
        t0 = time.time()
        s.sendall(req)
        data = s.recv(65536)
        # the engine's first event (a held stream gets the front's keep-alive comments first)
        while b"data: " not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
        t_first = time.time()
        while b"data: [DONE]" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
        s.close()
        if not data.startswith(b"HTTP/1.1 200") or b"data: [DONE]" not in data:
            raise RuntimeError(f"bench/switch: chat to {target} failed: {data[:300]!r}")
        calls = self._calls(t0, t_first)
        restore = sum(c["end"] - c["start"] for c in calls if c["pid"] == tpid)
        park = sum(c["end"] - c["start"] for c in calls if c["pid"] == opid)
        if not any(c["what"] == "restore" for c in calls if c["pid"] == tpid) or \
                not any(c["what"] == "checkpoint" for c in calls if c["pid"] == opid):
            raise RuntimeError(f"bench/switch: the switch to {target} made no restore or no "
                               f"park: {calls}")
        ttfb = t_first - t0
        row = {"target": target, "ttfb_ms": ttfb * 1e3, "restore_tool_ms": restore * 1e3,
               "park_tool_ms": park * 1e3, "move_ms": moved / self.rate * 1e3,
               "overhead_ms": (ttfb - restore - park) * 1e3,
               "overhead_incl_room_ms": (ttfb - restore) * 1e3,
               "calls": len(calls)}
        row["breakdown_ms"] = self._breakdown(self._timeline(seq), target, other, calls, tpid,
                                              opid, t0, t_first)
        self._until(lambda: self._state(target) == ("active", True), 10, f"{target} settled")
        return row

    def _breakdown(self, tl: list[dict], target: str, other: str, calls: list[dict],
                   tpid: int, opid: int, t0: float, t_first: float) -> dict:
        """Where Berth's own time goes, in ms (wall clock; berthd's monotonic ``at`` converted)."""
        def at(engine: str, kind: str, text: str = "") -> float | None:
            for e in tl:
                if e["engine"] == engine and e["kind"] == kind and text in e["text"]:
                    return e["at"] + self.offset
            return None
        asked = at(target, "wake", "wake asked")
        park_note = at(other, "park")
        parked = at(other, "parked")
        resume = at(target, "resume")
        ocalls = [c for c in calls if c["pid"] == opid]
        tcalls = [c for c in calls if c["pid"] == tpid]
        if None in (asked, park_note, parked, resume) or not ocalls or not tcalls:
            return {}
        ms = 1e3
        return {
            "front_to_berthd": (asked - t0) * ms,
            "park_instruction_to_tool": (ocalls[0]["start"] - park_note) * ms,
            "park_tool_to_confirmed": (parked - ocalls[-1]["end"]) * ms,
            "confirmed_to_resume": (resume - parked) * ms,
            "resume_instruction_to_tool": (tcalls[0]["start"] - resume) * ms,
            "restore_tool_to_first_byte": (t_first - tcalls[-1]["end"]) * ms,
            "between_tool_calls": sum(b["start"] - a["end"] for cs in (ocalls, tcalls)
                                      for a, b in zip(cs, cs[1:], strict=False)) * ms,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    ap.add_argument("-n", type=int, default=10, help="switches timed (default 10)")
    ap.add_argument("--rate", type=float, default=7e9,
                    help="the stand-in cuda-checkpoint's bytes per second (default 7e9)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="berth-bench-switch-"))
    b = Bench(tmp, a.rate)
    rows: list[dict] = []
    try:
        b.start()
        target = "A"
        for i in range(a.n + 1):
            row = b.switch(target)
            if i:                               # the first switch is a warm-up
                rows.append(row)
                print(f"switch {i:2d} -> {target}: ttfb {row['ttfb_ms']:7.1f} ms = restore "
                      f"{row['restore_tool_ms']:6.1f} + park {row['park_tool_ms']:6.1f} + Berth "
                      f"{row['overhead_ms']:6.1f} ms  (modelled data moves, both engines: "
                      f"{row['move_ms']:.0f} ms)", flush=True)
            target = "B" if target == "A" else "A"
    finally:
        b.stop()
        if a.keep:
            print(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    def col(k: str) -> list[float]:
        return [r[k] for r in rows]
    keys = ("ttfb_ms", "restore_tool_ms", "park_tool_ms", "move_ms", "overhead_ms",
            "overhead_incl_room_ms")
    stages = sorted({k for r in rows for k in r["breakdown_ms"]})
    out = {f"{k}_median": round(statistics.median(col(k)), 1) for k in keys}
    out.update({f"{k}_p90": round(_pct(col(k), 90), 1) for k in keys})
    out["breakdown_ms_median"] = {s: round(statistics.median(
        [r["breakdown_ms"][s] for r in rows if s in r["breakdown_ms"]]), 1) for s in stages}
    out.update({"target_ms": TARGET_MS, "n": len(rows), "rate_bytes_per_s": a.rate,
                "cpus": os.cpu_count(), "switches": rows})
    print(f"\n{len(rows)} switches, stand-in cuda-checkpoint at {a.rate / 1e9:g} GB/s, "
          f"{os.cpu_count()} CPUs")
    print(f"  time to first byte            median {out['ttfb_ms_median']:7.1f} ms   p90 "
          f"{out['ttfb_ms_p90']:7.1f} ms")
    print(f"  restore (tool calls)          median {out['restore_tool_ms_median']:7.1f} ms")
    print(f"  park of the other (tool)      median {out['park_tool_ms_median']:7.1f} ms")
    print(f"  overhead incl. making room    median {out['overhead_incl_room_ms_median']:7.1f} ms   "
          f"p90 {out['overhead_incl_room_ms_p90']:7.1f} ms   (ttfb - restore)")
    print(f"  overhead excl. mechanisms     median {out['overhead_ms_median']:7.1f} ms   p90 "
          f"{out['overhead_ms_p90']:7.1f} ms   (ttfb - restore - park; target <= "
          f"{TARGET_MS:g} ms: {'met' if out['overhead_ms_median'] <= TARGET_MS else 'NOT met'})")
    print("  where Berth's own time goes (median ms): " + ", ".join(
        f"{s} {v:.1f}" for s, v in out["breakdown_ms_median"].items()))
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
