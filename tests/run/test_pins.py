"""``berth.run.pins.pinned``: which engine commands pin their card (issue 35), so Berth never
moves them."""

from __future__ import annotations

import pytest
from berth.run.pins import pinned


@pytest.mark.parametrize("cmd, options, words", [
    (["env", "CUDA_VISIBLE_DEVICES=1", "vllm", "serve", "m"], {}, "CUDA_VISIBLE_DEVICES=1"),
    (["llama-server", "--port", "{port}", "--main-gpu", "1"], {}, "--main-gpu 1"),
    (["llama-server", "-dev", "CUDA1"], {}, "-dev CUDA1"),
    (["python", "serve.py", "--device=cuda:1"], {}, "--device cuda:1"),
    (["sglang", "--base-gpu-id", "2"], {}, "--base-gpu-id 2"),
    (["llama-server", "--tensor-split", "1,0"], {}, "--tensor-split 1,0"),
    (["ollama", "serve"], {"device": "1"}, "option device=1"),
])
def test_a_card_named_by_the_command_or_the_adapter_pins_it(cmd, options, words):
    why = pinned(cmd, options)
    assert why is not None and words in why, why


@pytest.mark.parametrize("cmd, options", [
    (["llama-server", "--port", "{port}", "-m", "/models/q.gguf"], {}),
    (["python", "serve.py", "--device", "cuda"], {}),
    (["python", "serve.py", "--device", "cpu"], {}),
    (["llama-server", "--main-gpu"], {}),
    (["ollama", "serve"], {"model": "llama3"}),
])
def test_a_command_that_names_no_card_may_move(cmd, options):
    assert pinned(cmd, options) is None
