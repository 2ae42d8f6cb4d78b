"""Helpers for the ``berth run`` acceptance tests (issue 5): a real berthd on one simulated 24 GiB
card, ``berth run`` lines started by :class:`tests.run.llamaswap.LlamaSwapModel` as llama-swap
starts them, and a streamed chat through a real OpenAI client (``tests.helpers.sweep`` kills
every process a test started, even when the test fails)."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from tests.berthd import BERTH, BIN, FREE_DELAY, READ_INTERVAL, RELEASE_GRACE, Berthd, api
from tests.helpers import free_port, openai, wait_for  # noqa: F401  (re-exported)
from tests.run.llamaswap import LlamaSwapModel

CHECKPOINT = str(BIN / "berth-sim-cuda-checkpoint")
GiB = 1 << 30


def config(tmp: Path, *, total: str = "24GiB", reserve: str = "1GiB",
           checkpoint_rate: str = "70GB", policy: dict | None = None) -> Path:
    """berth.toml for one simulated card ``gpu0``. The stand-in cuda-checkpoint moves
    ``checkpoint_rate`` per second (10x the demo's 7 GB/s: a 13 GiB move takes 0.2 s, so the suite
    stays short; the mechanism's speed is not what these tests check)."""
    pol = {"min_turn": "0s", "juggle_window": "0s", "ram_budget": "64GiB",
           "release_grace": RELEASE_GRACE, "read_interval": READ_INTERVAL, **(policy or {})}
    text = (f'state_dir = "{tmp / "state"}"\n'
            f'[driver]\nkind = "sim"\nsim_dir = "{tmp / "sim"}"\nfree_delay = "{FREE_DELAY}"\n'
            f'checkpoint_rate = "{checkpoint_rate}"\n'
            f'[[driver.cards]]\npci = "0000:01:00.0"\nname = "gpu0"\ntotal = "{total}"\n'
            f'[cards.gpu0]\nreserve = "{reserve}"\n[board]\nlisten = "off"\n[policy]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in pol.items()))
    path = tmp / "berth.toml"
    path.write_text(text)
    return path



def run_cmd(engine: str, *, size: str = "14GiB", weights: str = "13GiB", park: bool = True,
            run_args: tuple[str, ...] = (), engine_args: tuple[str, ...] = (),
            engine_argv: list[str] | None = None) -> str:
    """A llama-swap ``cmd`` text: ``berth run --front 127.0.0.1:${PORT} ... -- ENGINE``; the
    engine listens on ``{port}``, the port the run picks."""
    argv = [BERTH, "run", "--engine", engine, "--front", "127.0.0.1:${PORT}", "--size", size]
    if park:
        argv += ["--park", "checkpoint", "--checkpoint-path", CHECKPOINT]
    argv += [*run_args, "--"]
    argv += engine_argv if engine_argv is not None else [
        BERTH, "sim", "engine", "--port", "{port}", "--weights", weights, "--load-s", "0.2",
        "--model", engine, *engine_args]
    return " ".join(a if "${PORT}" in a else shlex.quote(a) for a in argv)


class World:
    """One test's berthd (not started until :meth:`start_berthd`) and its llama-swap models."""

    def __init__(self, tmp: Path, **cfg):
        self.tmp = tmp
        self.d = Berthd(tmp, config(tmp, **cfg))
        self.models: list[LlamaSwapModel] = []

    @property
    def env(self) -> dict[str, str]:
        return self.d.env

    def start_berthd(self) -> Berthd:
        return self.d.start()

    def model(self, name: str, cmd: str, **kw) -> LlamaSwapModel:
        m = LlamaSwapModel(name, cmd, port=free_port(), env=self.env,
                           log=self.tmp / f"run-{name}.log", **kw)
        self.models.append(m)
        return m

    def engine_pid(self, engine: str) -> int:
        return wait_for(lambda: (self.d.lease_of(engine) or {}).get("pid"), 20,
                        f"{engine}'s engine attached")

    def operator(self, op: str, target: str) -> tuple[int, dict]:
        return api(self.d.sock, "POST", f"/v1/operator/{op}", {"target": target})

    def sim(self):
        from berth.sim.cards import SimCards
        return SimCards(self.tmp / "sim").snapshot()

    def log(self, name: str) -> str:
        return (self.tmp / f"run-{name}.log").read_text(errors="replace")


@dataclass
class Answer:
    """A streamed chat as the OpenAI client saw it."""

    chunks: int = 0             # every chunk the client parsed
    content_chunks: int = 0     # chunks with non-empty delta content
    finish_reason: str | None = None
    text: str = ""
    first_s: float | None = None
    total_s: float = 0.0


def chat(port: int, model: str, *, max_tokens: int = 8, timeout_s: float = 60.0) -> Answer:
    """A streamed chat completion through a real ``openai`` client to the front on ``port``."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                           timeout=timeout_s)
    ans = Answer()
    t0 = time.monotonic()
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"hello {model}"}],
            max_tokens=max_tokens, stream=True)
        for chunk in stream:
            if ans.first_s is None:
                ans.first_s = time.monotonic() - t0
            ans.chunks += 1
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    ans.content_chunks += 1
                    ans.text += choice.delta.content
                if choice.finish_reason:
                    ans.finish_reason = choice.finish_reason
    finally:
        client.close()
    ans.total_s = time.monotonic() - t0
    return ans
