"""``berth demo``: the main job on the embedded default, with no GPU.

Source: issue 5 "berth demo", issue 13 (the case users care most about: an LLM and ComfyUI on
one card), issue 12 case 3 (a normal host, the default policy). It starts a temporary berthd on
one simulated 12 GiB card (1 GiB reserve) in a simulated host of 24 GiB RAM, on the default
policy (RAM budget: 80 % of the host; minimum turn; juggle guard), runs a stub LLM engine of
6 GiB under ``berth run --park checkpoint`` and the ComfyUI stand-in with Berth's real custom
node (its own process, leased from inside, growth bound), sends a scripted client's streamed
chats to the LLM and image prompts to ComfyUI, interleaved (a 6.5 GiB diffusion model does not
fit beside the LLM, so each switch parks one of them; host RAM holds both parked), and prints a
timeline (who parked and woke, how long each request waited and why) and the final board. It
exits 0 when every chat was answered in full, every image prompt succeeded, no switch drained,
and the simulated card recorded no out-of-memory event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from berth.board_text import render
from berth.client import Client

__all__ = ["arguments", "run_demo"]

_KINDS = {"grant": "grant", "plan": "plan", "park": "park", "parked": "parked", "extend": "extend",
          "resume": "wake", "wake": "wake", "drain": "drain", "freed": "freed",
          "fallback": "fallback", "lease.unparked": "unparked", "ready": "ready"}

CONFIG = """\
# berth demo: one simulated 12 GiB card with a 1 GiB reserve, in a host of 24 GiB RAM.
# The policy is the default one (RAM budget, minimum turn, juggle guard) but for reads.
state_dir = "{tmp}/state"

[driver]
kind = "sim"
sim_dir = "{tmp}/sim"
free_delay = "0.5s"             # a dead process's memory frees after this, as drivers do
checkpoint_rate = "{rate}"      # the stand-in cuda-checkpoint's speed (the demo: 7 GB/s, a measured rate)
host_ram = "24GiB"              # the simulated host: ram_budget "auto" takes 80 % of it

[[driver.cards]]
pci = "0000:01:00.0"
name = "gpu0"
total = "12GiB"

[cards.gpu0]
reserve = "1GiB"

[policy]
read_interval = "0.25s"

[engines.comfyui]               # ComfyUI's lease: its custom node registers it from inside
size = "10GiB"
growth_allowance = "1GiB"       # activations on top of the model files a prompt names
"""

#: The demo's model files (sparse: only their size matters): a FLUX-sized diffusion model.
MODELS = (("diffusion_models", "sdxl-base.safetensors", 6656 << 20),
          ("vae", "ae.safetensors", 320 << 20))
IMAGE = {"1": {"class_type": "UNETLoader", "inputs": {"unet_name": "sdxl-base.safetensors"}},
         "2": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
         "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024}},
         "4": {"class_type": "KSampler", "inputs": {"steps": 8}},
         "5": {"class_type": "VAEDecode", "inputs": {}},
         "6": {"class_type": "SaveImage", "inputs": {}}}


def _node_dir() -> Path:
    """Berth's ComfyUI node folder (``berth_hosts.comfyui``), found without importing it:
    the stand-in loads it from its file path, as ComfyUI does."""
    import importlib.util
    spec = importlib.util.find_spec("berth_hosts.comfyui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("berth demo: the ComfyUI node (berth_hosts.comfyui) is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _port() -> int:
    """A free port below the ephemeral range (:func:`berth.sim.ports.free_ports`): a
    bind(0) port could be an outgoing connection's by the time its server binds it."""
    from berth.sim.ports import free_ports
    return free_ports()


class Demo:
    def __init__(self, tmp: Path, out=sys.stdout, stay: bool = False):
        self.tmp = tmp
        self.stay = stay
        self.out = out
        self.t0 = time.monotonic()
        self.procs: list[subprocess.Popen] = []
        self.seen = 0           # the last timeline entry printed (its seq)
        self.bin = Path(sys.executable).parent
        self.env = {**os.environ, "BERTH_STATE_DIR": str(tmp / "state"),
                    "BERTH_SOCKET": str(tmp / "state" / "berthd.sock"),
                    "BERTH_SIM_DIR": str(tmp / "sim"), "BERTH_CONFIG": str(tmp / "berth.toml"),
                    "PYTHONUNBUFFERED": "1"}
        self.ports = {"A": _port(), "comfyui": _port(), "board": _port()}
        self.board_url = f"http://127.0.0.1:{self.ports['board']}/"
        self.client: Client | None = None

    def say(self, text: str) -> None:
        """A line of the demo's own, printed at once with its time since the start."""
        self._line(time.monotonic() - self.t0, text)

    def _line(self, t: float, text: str) -> None:
        self.out.write(f"{t:7.2f}s  {text}\n")
        self.out.flush()

    async def _follow(self) -> None:
        """Print berthd's timeline as it happens (a long poll), not at the end: the demo's
        switches take half a minute and a user would otherwise watch a silent terminal."""
        assert self.client is not None
        while True:
            await self._timeline_since(5.0)

    async def _timeline_since(self, wait_s: float) -> None:
        assert self.client is not None
        entries = (await self.client.timeline(self.seen, wait_s))["entries"]
        for e in entries:       # berthd's "at" is the same monotonic clock (CLOCK_MONOTONIC)
            self.seen = max(self.seen, e["seq"])
            kind = _KINDS.get(e["kind"])
            if kind:
                self._line(e["at"] - self.t0, f"  berthd {kind:<8} {e['text']}")

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        p = subprocess.Popen(args, env=self.env, stdout=open(self.tmp / log, "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    async def run(self) -> int:
        """The demo; its berthd client is closed however it ends (Ctrl-C cancels it). SIGHUP
        (its terminal closed) and SIGTERM cancel it too and raise :class:`Stopped`: their
        default action killed the demo and left berthd and the engines running."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        got: list[signal.Signals] = []

        def stop(sig: signal.Signals) -> None:
            got.append(sig)
            task.cancel()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await self._run()
        except asyncio.CancelledError:
            if got:
                raise Stopped(got[0]) from None
            raise
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            if self.client is not None:
                await self.client.close()

    async def _run(self) -> int:
        board = f'\n[board]\nlisten = "127.0.0.1:{self.ports["board"]}"\n'
        (self.tmp / "berth.toml").write_text(CONFIG.format(tmp=self.tmp, rate="7GB") + board)
        berth = str(self.bin / "berth")
        self._spawn([berth, "daemon"], "berthd.log")
        self.client = Client(self.env["BERTH_SOCKET"])
        await self._until(self._berthd_up, 20, "berthd to start")
        self.out.write(f"The board, live while the demo runs: {self.board_url}\n")
        self.out.write("Berth demo: a 6 GiB LLM and ComfyUI share one simulated 12 GiB card "
                       "(host RAM 24 GiB)\n\n")
        self.say("berthd up: gpu0, 12.0GiB simulated, 1.0GiB reserve; host RAM 24.0GiB")
        follow = asyncio.get_running_loop().create_task(self._follow())
        try:
            ok = await self._steps(berth)
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        await self._timeline_since(0.0)
        st = await self.client.status()
        oom = self._oom()
        await self.client.close()
        self._print(st, oom)
        drained = st["counters"]["drains"] + st["counters"]["fallbacks_to_drain"]
        if self.stay:
            await self._stay()
        return 0 if ok and oom == 0 and drained == 0 else 1

    async def _steps(self, berth: str) -> bool:
        """Start A and ComfyUI, then chat and make images in turn; ``True`` if all answered."""
        self._spawn([berth, "run", "--engine", "A", "--front", f"127.0.0.1:{self.ports['A']}",
                     "--size", "6GiB", "--park", "checkpoint", "--checkpoint-path",
                     str(self.bin / "berth-sim-cuda-checkpoint"), "--",
                     berth, "sim", "engine", "--port", "{port}", "--weights", "5.5GiB",
                     "--load-s", "1", "--kv-per-token", "1MiB"], "run-A.log")
        self.say(f"berth run A: a 6GiB LLM, park by checkpoint, front 127.0.0.1:{self.ports['A']}")
        await self._until(lambda: self._lease_of("A"), 20, "A's lease")
        self._spawn([berth, "sim", "comfyui", "--port", str(self.ports["comfyui"]),
                     "--models", str(self._models()), "--custom-node", str(_node_dir()),
                     "--disable-dynamic-vram"], "comfyui.log")
        self.say(f"ComfyUI (the stand-in, legacy loading) with Berth's node, "
                 f"127.0.0.1:{self.ports['comfyui']}: it leases its own process")
        await self._until(lambda: self._lease_of("comfyui"), 20, "ComfyUI's lease")
        await self._until(self._settled, 40, "the LLM serving and ComfyUI leased")
        self.say("the card has settled: the LLM serves, ComfyUI holds its context only")
        ok = True
        async with aiohttp.ClientSession() as http:
            for step in ("A", "image", "A", "image", "A"):
                ok &= await (self._image(http) if step == "image" else self._chat(http, step))
        return ok

    async def _stay(self) -> None:
        """``--stay``: berthd, both engines and the board stay up until SIGINT, SIGTERM or
        SIGHUP (its terminal closed)."""
        # A user's next step is a second terminal: berth's commands there read the default
        # socket, not the demo's, unless they are given the demo's config.
        chat = json.dumps({"model": "A", "max_tokens": 24,
                           "messages": [{"role": "user", "content": "hello A"}]})
        self.out.write(
            f"\nberthd, the engines and the board stay up: {self.board_url} (Ctrl-C to stop)\n"
            f"  berth's commands reach this berthd in a shell with its config:\n"
            f"    export BERTH_CONFIG={shlex.quote(self.env['BERTH_CONFIG'])}\n"
            f"    berth status; berth park A; berth wake A\n"
            f"    curl -s -H 'Content-Type: application/json' -d '{chat}' "
            f"http://127.0.0.1:{self.ports['A']}/v1/chat/completions\n"
            f"  ComfyUI (the stand-in): http://127.0.0.1:{self.ports['comfyui']}/\n")
        self.out.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    def _models(self) -> Path:
        models = self.tmp / "models"
        for folder, name, size in MODELS:
            (models / folder).mkdir(parents=True, exist_ok=True)
            with open(models / folder / name, "wb") as f:
                f.truncate(size)
        return models

    async def _state(self, name: str) -> str:
        st = await self.client.status()
        lease = next((le for le in st["leases"] if le["engine"] == name), None)
        state = lease["shares"][0]["state"] if lease else "?"
        return "loading" if state == "active" and not lease["ready"] else state

    async def _image(self, http: aiohttp.ClientSession) -> bool:
        state = await self._state("comfyui")
        url = f"http://127.0.0.1:{self.ports['comfyui']}"
        t = time.monotonic()
        async with http.post(url + "/prompt", json={"prompt": IMAGE},
                             timeout=aiohttp.ClientTimeout(total=60)) as r:
            ans = await r.json(content_type=None)
            if r.status != 200:
                self.say(f"image → ComfyUI: HTTP {r.status} {ans}")
                return False
        queued = time.monotonic() - t
        pid = ans["prompt_id"]
        status = None
        while time.monotonic() - t < 60:
            async with http.get(f"{url}/history/{pid}") as r:
                h = (await r.json()).get(pid)
            if h:
                status = h["status"]
                break
            await asyncio.sleep(0.1)
        why = {"parked": "it was parked: woken by the prompt, the LLM parked for it",
               "active": "it was leased; its 6.8GiB of model files asked for room first"
               }.get(state, f"it was {state}")
        ok = bool(status and status["status_str"] == "success")
        self.say(f"image → ComfyUI: queued after {queued:.2f}s, "
                 f"{'done' if ok else 'FAILED'} after {time.monotonic() - t:.2f}s ({why})"
                 + ("" if ok else f": {status}"))
        return ok

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
        by = {le["engine"]: le for le in st["leases"]}
        return all(e in by and by[e]["ready"] and by[e]["shares"][0]["state"] == "active"
                   for e in ("A", "comfyui"))

    async def _until(self, pred, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if await pred():
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"berth demo: timed out waiting for {what}; logs in {self.tmp}")

    async def _chat(self, http: aiohttp.ClientSession, name: str) -> bool:
        state = await self._state(name)
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
        why = {"active": "it was serving",
               "parked": "it was parked: woken on the first write, ComfyUI parked for it",
               "waiting": "it was waiting for its lease",
               "loading": "it was loading"}.get(state, f"it was {state}")
        self.say(f"chat → {name}: first byte after {first:.2f}s, "
                 f"{chunks} chunks in {total:.2f}s ({why})")
        return chunks > 0

    def _oom(self) -> int:
        from berth.sim.cards import SimCards
        return sum(c.oom_events for c in SimCards(self.tmp / "sim").snapshot().cards)

    def _print(self, st: dict, oom: int) -> None:
        w = self.out.write
        w("\nThe board at the end:\n")
        w(render(st) + "\n")
        k = st["counters"]
        w(f"\nparks by checkpoint (the LLM): {k['checkpoints']}, parks by hook (ComfyUI): "
          f"{k['parks']}, wakes: {k['wakes']}, extensions: {k.get('extensions', 0)}, drains: "
          f"{k['drains']} (fallbacks to drain: {k['fallbacks_to_drain']}), out-of-memory events "
          f"on the card: {oom}\n")
        drained = k["drains"] + k["fallbacks_to_drain"]
        w("OK: every chat answered, every image made, every switch a park, no OOM.\n"
          if oom == 0 and not drained else "FAILED: the card saw an OOM.\n" if oom
          else "FAILED: a switch drained.\n")

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


#: The signals besides Ctrl-C's that stop the demo in order (SIGHUP: its terminal closed).
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


class Stopped(Exception):
    """The demo was stopped by a signal other than Ctrl-C's (:data:`STOP_SIGNALS`)."""

    def __init__(self, sig: signal.Signals):
        super().__init__(sig.name)
        self.signal = sig


def run_demo(keep: bool = False, stay: bool = False) -> int:
    """Run the demo; its exit status: 0 or 1 (its verdict), 130 on Ctrl-C, 129 on SIGHUP (its
    terminal closed), 143 on SIGTERM, its berthd and engines stopped however it ends."""
    tmp = Path(tempfile.mkdtemp(prefix="berth-demo-"))
    demo = Demo(tmp, stay=stay)
    try:
        return asyncio.run(demo.run())
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C is how a user leaves a demo: no traceback (the cleanup below stops it all).
        print("berth demo: stopped by Ctrl-C; stopping its berthd and engines", file=sys.stderr)
        return 130
    except Stopped as e:
        # The same stop as Ctrl-C's, 128 + the signal's number (129 for SIGHUP, as berth run's).
        why = " (its terminal closed)" if e.signal == signal.SIGHUP else ""
        print(f"berth demo: stopped by {e.signal.name}{why}; stopping its berthd and engines",
              file=sys.stderr)
        return 128 + int(e.signal)
    finally:
        # A second Ctrl-C or SIGHUP must not cut the cleanup short (and leave berthd and the
        # engines running): it is bounded anyway (SIGTERM, 10 s, SIGKILL).
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)
        demo.cleanup()
        if keep:
            print(f"(logs kept in {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def arguments(p) -> None:
    """Fill ``berth demo``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and logs")
    p.add_argument("--stay", action="store_true",
                   help="after the demo, keep berthd, the engines and the board up until Ctrl-C")
    p.set_defaults(func=lambda a: run_demo(a.keep, a.stay))
