"""The real llama-swap in front of real llama.cpp servers, alone or under Berth: the harness that
``bench/llamaswap.py`` and the tests marked ``real`` share.

Source: issue 30; ``../shared/tools/README.md`` (the programs: llama-swap v250-5-g0bdb37, a CPU
``llama-server``, two tiny GGUFs). The programs are test fixtures and never part of the
project: :func:`Tools.find` looks for them in ``$BERTH_REAL_TOOLS``, else in ``shared/tools``
beside the checkout (``<repo>/../shared/tools``).

:class:`Swap` runs one llama-swap with the given models, each a ``llama-server`` (one GGUF, or
llama.cpp's router over the models folder), started through ``berth-sim-charge`` so that its
memory shows on a simulated card (:mod:`berth.sim.charge`):

- **under Berth** (``berth=True``): a berthd on simulated cards, the source config wrapped by
  ``berth llama-swap wrap`` as a user runs it (its defaults, plus ``wrap_args``), and llama-swap
  on the wrapped config;
- **alone**: llama-swap on the source config, which swaps models itself (one runs at a time).

Every process it starts has ``BERTH_STATE_DIR`` under its directory in its environment, so
:meth:`Swap.processes` finds each one (llama-swap's children and theirs too) and
:meth:`Swap.close` ends them all.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["TOOLS_ENV", "Tools", "Model", "Swap", "Answer", "tools_dir", "wait_until"]

TOOLS_ENV = "BERTH_REAL_TOOLS"
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tools_dir() -> Path:
    """Where the real programs are looked for: ``$BERTH_REAL_TOOLS``, else
    ``<repo>/../shared/tools``."""
    return Path(os.environ.get(TOOLS_ENV) or REPO.parent / "shared" / "tools")


def wait_until(check, timeout_s: float, what: str, every_s: float = 0.02):
    """Poll ``check()`` until truthy (returned); ``AssertionError`` naming ``what`` after
    ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} "
                                 f"(last: {got!r})")
        time.sleep(every_s)


@dataclass(frozen=True)
class Tools:
    """The real programs: ``llama-swap``, ``llama-server`` and the ``models`` folder."""

    root: Path

    @property
    def llama_swap(self) -> Path:
        return self.root / "llama-swap"

    @property
    def llama_server(self) -> Path:
        return self.root / "llama-server"

    @property
    def models(self) -> Path:
        return self.root / "models"

    def missing(self) -> list[str]:
        """What is not there (empty when every program and model is)."""
        out = [str(p) for p in (self.llama_swap, self.llama_server) if not os.access(p, os.X_OK)]
        out += [str(self.models / m) for m in ("tiny-a.gguf", "tiny-b.gguf")
                if not (self.models / m).is_file()]
        return out

    @classmethod
    def find(cls, root: Path | None = None) -> "Tools":
        return cls(Path(root) if root else tools_dir())


@dataclass
class Model:
    """One llama-swap model. ``gguf``: the single model it serves, or ``None`` for llama.cpp's
    router over the models folder (each loaded model a child charged ``child_size``). ``size``:
    the memory it holds on the simulated card when it serves (the router's own part is ``size``
    less ``child_size``), and its berth.toml size. ``run``:
    ``berth run`` flags of its own (the cmd is then written wrapped; wrap leaves it so).
    ``server``: more ``llama-server`` flags. ``ttl``: llama-swap's ``ttl``. ``front_health``:
    ``False`` writes the cmd wrapped as a hand-written run line without ``--front-health`` and
    ``--keep-front`` (wrap leaves it so): llama-swap's health check then passes only once the
    engine serves, so its request waits in llama-swap for the next poll after the front opens,
    and a drained run exits."""

    id: str
    gguf: str | None = "tiny-a.gguf"
    size: str = "3GiB"
    child_size: str = "2GiB"
    ctx: int = 256
    ttl: int | None = None
    run: tuple[str, ...] = ()
    server: tuple[str, ...] = ()
    priority: int | None = None
    front_health: bool = True

    @property
    def wrapped(self) -> bool:
        """Whether its cmd is written as a ``berth run`` line already."""
        return bool(self.run) or not self.front_health


@dataclass
class Answer:
    """One request's answer: status, body, the SSE events (``data:`` payloads) and comment
    lines of a stream with the time each arrived (seconds after the request was sent), the time
    to the first byte and in all."""

    status: int
    body: bytes = b""
    events: list[tuple[float, str]] = field(default_factory=list)
    comments: list[tuple[float, str]] = field(default_factory=list)
    first_s: float = 0.0
    total_s: float = 0.0
    sent_at: float = 0.0        # time.monotonic() when it was sent
    logs: str = ""              # on an answer other than 200: the logs' last lines (a test's message)

    def json(self):
        return json.loads(self.body)

    def text(self) -> str:
        """A stream's content and reasoning text joined (the whole body otherwise)."""
        if not self.events:
            return self.body.decode("utf-8", "replace")
        out = []
        for _, data in self.events:
            if data == "[DONE]":
                continue
            for c in json.loads(data).get("choices") or []:
                d = c.get("delta") or {}
                out.append((d.get("reasoning_content") or "") + (d.get("content") or ""))
        return "".join(out)


def _free_range(n: int, avoid: int | None = None) -> int:
    """A port with ``n`` free ports from it on (llama-swap gives ``${PORT}`` from
    ``startPort`` up, in sorted model order), none of them ``avoid`` (llama-swap's own, not
    bound yet), below the kernel's ephemeral range: the servers and fronts bind them seconds
    later, and a port an outgoing connection may get meanwhile made llama-swap's model exit
    "prematurely" on a busy machine. Raises ``RuntimeError`` when none is found."""
    from berth.sim.ports import free_ports
    for _ in range(20):
        base = free_ports(n)
        if avoid is None or not base <= avoid < base + n:
            return base
    raise RuntimeError(f"no {n} free ports apart from {avoid}")


def _free_port() -> int:
    """llama-swap's own port, with :func:`_free_range`'s care (it binds it after a while)."""
    return _free_range(1)


class Swap:
    """One real llama-swap with ``models`` in directory ``tmp`` (see the module docstring).

    ``card``/``reserve``: the one simulated card and its reserve; ``free_delay``: how long the
    simulated driver takes to free a dead process's memory; ``policy``: berth.toml ``[policy]``
    values; ``wrap_args``: more ``berth llama-swap wrap`` flags; ``charge``: run each server
    through ``berth-sim-charge`` (alone too, on a card large enough for every model)."""

    def __init__(self, tmp: Path, tools: Tools, models: list[Model], *, berth: bool = True,
                 card: str = "4GiB", reserve: str = "512MiB", free_delay: str = "0.2s",
                 policy: dict | None = None, wrap_args: tuple[str, ...] = (),
                 charge: bool = True, extra_config: dict | None = None):
        self.tmp, self.tools, self.models = Path(tmp), tools, models
        self.berth, self.charge = berth, charge
        self.card, self.reserve, self.free_delay = card, reserve, free_delay
        self.policy = {"min_turn": "0s", "juggle_window": "0s", "read_interval": "0.2s",
                       **(policy or {})}
        self.wrap_args, self.extra_config = tuple(wrap_args), extra_config or {}
        self.state, self.sim = self.tmp / "state", self.tmp / "sim"
        self.config = self.tmp / "berth.toml"
        self.source, self.wrapped = self.tmp / "source.yaml", self.tmp / "llama-swap.yaml"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "BERTH_STATE_DIR": str(self.state),
                    "BERTH_SOCKET": str(self.state / "berthd.sock"),
                    "BERTH_SIM_DIR": str(self.sim), "BERTH_CONFIG": str(self.config),
                    "PYTHONUNBUFFERED": "1"}
        self.berthd: subprocess.Popen | None = None
        self.proc: subprocess.Popen | None = None
        self.wrap_stderr = ""

    # -- the files ---------------------------------------------------------------------------------
    def _server(self, m: Model) -> list[str]:
        srv = [str(self.tools.llama_server)]
        srv += ["-m", str(self.tools.models / m.gguf)] if m.gguf else [
            "--models-dir", str(self.tools.models), "--models-max", "1"]
        srv += ["--port", "{port}" if m.wrapped else "${PORT}", "--host", "127.0.0.1",
                "-c", str(m.ctx), "-t", "1", *m.server]
        if not self.charge:
            return srv
        base = _bytes(m.size) - (0 if m.gguf else _bytes(m.child_size))
        charge = [str(BIN / "berth-sim-charge"), "--size", f"{base}B"]
        if not m.gguf:
            charge += ["--per-child", m.child_size]
        return [*charge, "--", *srv]

    def _cmd(self, m: Model) -> str:
        words = self._server(m)
        if m.wrapped:
            front = ["--front-health", "--keep-front"] if m.front_health else []
            words = [str(BIN / "berth"), "run", "--engine", m.id, "--front",
                     "127.0.0.1:${PORT}", *front, *m.run, "--", *words]
        return " ".join(words)

    def write(self) -> None:
        """berth.toml, the simulated card and the source llama-swap config."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        lines = [f'state_dir = "{self.state}"', "[driver]", 'kind = "sim"',
                 f'sim_dir = "{self.sim}"', f'free_delay = "{self.free_delay}"',
                 "[[driver.cards]]", 'pci = "0000:01:00.0"', 'name = "gpu0"',
                 f'total = "{self.card if self.berth else "1TiB"}"',
                 "[cards.gpu0]", f'reserve = "{self.reserve}"', "[policy]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.policy.items()]
        for m in self.models:
            lines += [f'[engines."{m.id}"]', f'size = "{m.size}"']
            if m.priority is not None:
                lines.append(f"priority = {m.priority}")
        self.config.write_text("\n".join(lines) + "\n")
        doc: dict = {"healthCheckTimeout": 120, "startPort": _free_range(len(self.models), self.port),
                     "logLevel": "debug", "models": {}, **self.extra_config}
        for m in self.models:
            entry: dict = {"cmd": self._cmd(m)}
            if m.ttl is not None:
                entry["ttl"] = m.ttl
            doc["models"][m.id] = entry
        self.source.write_text(json.dumps(doc, indent=1))   # JSON is YAML

    # -- lifetime ----------------------------------------------------------------------------------
    def start(self) -> "Swap":
        """Write the files, start berthd and wrap (under Berth), then llama-swap; returns when
        llama-swap answers."""
        self.write()
        if self.berth:
            self._start_berthd()
            r = subprocess.run([str(BIN / "berth"), "llama-swap", "wrap", str(self.source),
                                "-o", str(self.wrapped), *self.wrap_args], env=self.env,
                               capture_output=True, text=True, timeout=60)
            self.wrap_stderr = r.stderr
            if r.returncode != 0:
                raise RuntimeError(f"wrap failed: {r.stderr}")
        else:
            from berth.sim.cards import CardSpec, SimCards
            SimCards.init(self.sim, [CardSpec.make("gpu0", 1 << 40)], free_delay_s=0.0)
            self.wrapped.write_text(self.source.read_text())
        with open(self.tmp / "llama-swap.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.tools.llama_swap), "--config", str(self.wrapped), "--listen",
                 f"127.0.0.1:{self.port}"], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until(self._up, 30, "llama-swap to answer")
        return self

    def _start_berthd(self) -> None:
        sock = self.state / "berthd.sock"
        with open(self.tmp / "berthd.log", "ab") as log:
            self.berthd = subprocess.Popen([str(BIN / "berth"), "daemon", "--config",
                                            str(self.config)], env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)

        def up():
            if self.berthd.poll() is not None:
                raise RuntimeError(f"berthd exited: {(self.tmp / 'berthd.log').read_text()}")
            return sock.exists() and self.berth_status() is not None
        wait_until(up, 30, "berthd to answer")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"llama-swap exited: {(self.tmp / 'llama-swap.log').read_text()}")
        try:
            return self.request("GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM llama-swap (it stops every model first) and wait; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        """Stop everything this swap started (llama-swap, its models, berthd) and reap."""
        with _quiet():
            self.stop(40)
        if self.berthd is not None and self.berthd.poll() is None:
            self.berthd.terminate()
            with _quiet():
                self.berthd.wait(15)
        left = self.processes()
        for p in left:
            with _quiet():
                p.kill()
        psutil.wait_procs(left, timeout=5)
        for p in (self.proc, self.berthd):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)

    def __enter__(self) -> "Swap":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def processes(self, name: str | None = None) -> list[psutil.Process]:
        """Every live process started for this swap (its environment names a state dir under
        ``tmp``), or those whose name is ``name``; zombies left out."""
        root = str(self.tmp)
        out = []
        for p in psutil.process_iter(["pid", "name", "status"]):
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                state = p.environ().get("BERTH_STATE_DIR", "")
            except (psutil.Error, OSError):
                continue
            if (state == root or state.startswith(root + os.sep)) and (
                    name is None or p.info["name"] == name):
                out.append(p)
        return out

    # -- requests ----------------------------------------------------------------------------------
    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 60.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def chat(self, model: str, *, stream: bool = False, max_tokens: int = 8,
             headers: dict | None = None, timeout: float = 120.0, extra: dict | None = None,
             on_comment=None, on_event=None) -> Answer:
        """A chat completion through llama-swap. A stream is read event by event;
        ``on_comment(answer)`` is called after each comment line (``: keep-alive``),
        ``on_event(answer)`` after each ``data:`` event."""
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens, "stream": stream, **(extra or {})}
        ans = post_chat(self.port, body, headers, timeout, on_comment, on_event)
        if ans.status != 200:
            ans.logs = self.log_tails()
        return ans

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` lines of llama-swap's log (it carries each model command's output)
        and of berthd's, for a failure's message."""
        out = []
        for name in ("llama-swap.log", "berthd.log"):
            p = self.tmp / name
            text = p.read_text(errors="replace") if p.exists() else ""
            out.append(f"--- {name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)

    def running(self) -> dict[str, str]:
        """llama-swap's ``/running``: model -> state."""
        status, raw = self.request("GET", "/running", timeout=10)
        assert status == 200, raw
        return {r["model"]: r["state"] for r in json.loads(raw)["running"]}

    def unload(self, model: str | None = None) -> int:
        return self.request("POST", "/api/models/unload" + (f"/{model}" if model else ""),
                            timeout=60)[0]

    # -- berthd --------------------------------------------------------------------------------------
    def berth_status(self) -> dict | None:
        """berthd's status JSON, or ``None`` when it does not answer."""
        r = subprocess.run([str(BIN / "berth"), "status", "--json"], env=self.env,
                           capture_output=True, text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def leases(self) -> dict[str, str]:
        """engine -> its shares' states (``"active"``, ``"parked"``, …)."""
        st = self.berth_status() or {"leases": []}
        return {le["engine"]: "/".join(s["state"] for s in le["shares"]) for le in st["leases"]}

    def sim_card(self) -> dict:
        """The simulated card: ``used_bytes``, ``oom_events``, ``processes`` (pid -> bytes)."""
        from berth.sim.cards import SimCards
        c = SimCards(self.sim).snapshot().cards[0]
        return {"used_bytes": c.used_bytes, "oom_events": c.oom_events,
                "processes": dict(c.processes)}


def post_chat(port: int, body: dict, headers: dict | None, timeout: float,
              on_comment=None, on_event=None) -> Answer:
    """POST ``body`` to ``/v1/chat/completions`` on ``port``; see :meth:`Swap.chat`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        ans = Answer(r.status, first_s=time.monotonic() - t0, sent_at=t0)
        if "text/event-stream" not in (r.getheader("Content-Type") or ""):
            ans.body = r.read()
        else:
            while True:
                line = r.readline()
                if not line:
                    break
                at, text = time.monotonic() - t0, line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith(":"):
                    ans.comments.append((at, text))
                    if on_comment is not None:
                        on_comment(ans)
                elif text.startswith("data:"):
                    ans.events.append((at, text[5:].strip()))
                    if on_event is not None:
                        on_event(ans)
        ans.total_s = time.monotonic() - t0
        return ans
    finally:
        conn.close()


def _bytes(size: str) -> int:
    from berth.decide.units import parse_size
    return parse_size(size)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, (Exception,))
