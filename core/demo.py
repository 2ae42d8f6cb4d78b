"""``berth demo``: the main job on the embedded default, with no GPU.

Source: issue 5 "berth demo". It starts a temporary berthd on one simulated 24 GiB card (1 GiB
reserve), runs two stub engines of 14 GiB each under ``berth run --park checkpoint`` (two 14 GiB
engines cannot share a 24 GiB card, so one is always parked in simulated host RAM), sends a
scripted client's streamed chats to A, B, A, B through their fronts, and prints a timeline (who
parked and woke, how long each request waited and why) and the final board. It exits 0 when
every chat was answered in full and the simulated card recorded no out-of-memory event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from berth.board import render
from berth.client import Client

__all__ = ["register", "run_demo"]

_KINDS = {"grant": "grant", "plan": "plan", "park": "park", "parked": "parked",
          "resume": "wake", "wake": "wake", "drain": "drain", "freed": "freed",
          "fallback": "fallback", "lease.unparked": "unparked", "ready": "ready"}

CONFIG = """\
# berth demo: one simulated 24 GiB card with a 1 GiB reserve.
state_dir = "{tmp}/state"

[driver]
kind = "sim"
sim_dir = "{tmp}/sim"
free_delay = "0.5s"             # a dead process's memory frees after this, as drivers do
checkpoint_rate = "{rate}"      # the stand-in cuda-checkpoint's speed (the demo: 7 GB/s, seed 002)

[[driver.cards]]
pci = "0000:01:00.0"
name = "gpu0"
total = "24GiB"

[cards.gpu0]
reserve = "1GiB"

[policy]
min_turn = "0s"                 # the script alternates at once; a real box keeps a turn
juggle_window = "0s"
ram_budget = "64GiB"            # simulated host RAM for parked engines
read_interval = "0.25s"
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    def __init__(self, tmp: Path, out=sys.stdout):
        self.tmp = tmp
        self.out = out
        self.t0 = time.monotonic()
        self.procs: list[subprocess.Popen] = []
        self.events: list[tuple[float, str]] = []
        self.bin = Path(sys.executable).parent
        self.env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"),
                    "BERTH_SOCKET": str(tmp / "state" / "berthd.sock"),
                    "BERTH_SIM_DIR": str(tmp / "sim"), "BERTH_CONFIG": str(tmp / "berth.toml"),
                    "PYTHONUNBUFFERED": "1"}
        self.ports = {"A": _port(), "B": _port()}

    def say(self, text: str) -> None:
        self.events.append((time.monotonic() - self.t0, text))

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        p = subprocess.Popen(args, env=self.env, stdout=open(self.tmp / log, "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    async def run(self) -> int:
        (self.tmp / "berth.toml").write_text(CONFIG.format(tmp=self.tmp, rate="7GB"))
        berth = str(self.bin / "berth")
        self._spawn([berth, "daemon"], "berthd.log")
        self.client = Client(self.env["BERTH_SOCKET"])
        await self._until(self._berthd_up, 20, "berthd to start")
        self.say("berthd up: gpu0, 24.0GiB simulated, 1.0GiB reserve")
        for name in ("A", "B"):
            self._spawn([berth, "run", "--engine", name, "--front", f"127.0.0.1:{self.ports[name]}",
                         "--size", "14GiB", "--park", "checkpoint", "--checkpoint-path",
                         str(self.bin / "berth-sim-cuda-checkpoint"), "--",
                         berth, "sim", "engine", "--port", "{port}", "--weights", "13GiB",
                         "--load-s", "1", "--kv-per-token", "1MiB"], f"run-{name}.log")
            self.say(f"berth run {name}: 14GiB lease, park by checkpoint, front "
                     f"127.0.0.1:{self.ports[name]}")
            await self._until(lambda n=name: self._lease_of(n), 20, f"{name}'s lease")
        await self._until(self._settled, 40, "one engine serving and the other parked")
        self.say("the card has settled: one engine serves, the other is parked in host RAM")
        ok = True
        async with aiohttp.ClientSession() as http:
            for name in ("A", "B", "A", "B"):
                ok &= await self._chat(http, name)
        st = await self.client.status()
        oom = self._oom()
        timeline = (await self.client.timeline())["entries"]
        await self.client.close()
        self._print(timeline, st, oom)
        return 0 if ok and oom == 0 else 1

    async def _berthd_up(self) -> bool:
        try:
            await self.client.status()
            return True
        except Exception:
            return False

    async def _lease_of(self, name: str) -> bool:
        st = await self.client.status()
        return any(le["engine"] == name for le in st["leases"])

    async def _settled(self) -> bool:
        st = await self.client.status()
        states = sorted(sh["state"] for le in st["leases"] for sh in le["shares"])
        serving = [le for le in st["leases"] if le["ready"]
                   and all(sh["state"] == "active" for sh in le["shares"])]
        return states == ["active", "parked"] and len(serving) == 1

    async def _until(self, pred, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if await pred():
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"berth demo: timed out waiting for {what}; logs in {self.tmp}")

    async def _chat(self, http: aiohttp.ClientSession, name: str) -> bool:
        st = await self.client.status()
        lease = next((le for le in st["leases"] if le["engine"] == name), None)
        state = lease["shares"][0]["state"] if lease else "?"
        if state == "active" and not lease["ready"]:
            state = "loading"
        url = f"http://127.0.0.1:{self.ports[name]}/v1/chat/completions"
        body = {"model": name, "stream": True, "max_tokens": 24,
                "messages": [{"role": "user", "content": f"hello {name}"}]}
        t = time.monotonic()
        first = None
        chunks = 0
        text = ""
        async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
            if r.status != 200:
                self.say(f"chat → {name}: HTTP {r.status} {await r.text()}")
                return False
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                if first is None:
                    first = time.monotonic() - t
                if line.strip() == b"data: [DONE]":
                    break
                chunks += 1
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                text += delta.get("content") or ""
        total = time.monotonic() - t
        why = {"active": "it was serving", "parked": "it was parked: woken on the first write",
               "waiting": "it was waiting for its lease",
               "loading": "it was loading"}.get(state, f"it was {state}")
        self.events.append((t - self.t0, f"chat → {name}: first byte after {first:.2f}s, "
                                         f"{chunks} chunks in {total:.2f}s ({why})"))
        return chunks > 0

    def _oom(self) -> int:
        from berth.sim.cards import SimCards
        return sum(c.oom_events for c in SimCards(self.tmp / "sim").snapshot().cards)

    def _print(self, timeline: list[dict], st: dict, oom: int) -> None:
        rows = list(self.events)
        for e in timeline:          # berthd's "at" is the same monotonic clock (CLOCK_MONOTONIC)
            kind = _KINDS.get(e["kind"])
            if kind:
                rows.append((e["at"] - self.t0, f"  berthd {kind:<8} {e['text']}"))
        rows.sort(key=lambda r: r[0])
        w = self.out.write
        w("Berth demo: two 14 GiB engines share one simulated 24 GiB card\n\n")
        for t, text in rows:
            w(f"{t:7.2f}s  {text}\n")
        w("\nThe board at the end:\n")
        w(render(st) + "\n")
        k = st["counters"]
        w(f"\nparks by checkpoint: {k['checkpoints']}, wakes: {k['wakes']}, drains: {k['drains']}, "
          f"out-of-memory events on the card: {oom}\n")
        w("OK: every chat answered, no OOM.\n" if oom == 0 else "FAILED: the card saw an OOM.\n")

    def cleanup(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def run_demo(keep: bool = False) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="berth-demo-"))
    demo = Demo(tmp)
    try:
        return asyncio.run(demo.run())
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    finally:
        demo.cleanup()
        if keep:
            print(f"(logs kept in {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job on a simulated card: two engines, one card, "
                                    "parks and wakes")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and logs")
    p.set_defaults(func=lambda a: run_demo(a.keep))
