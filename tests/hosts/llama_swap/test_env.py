"""Issue 12 case 8: ``berth llama-swap wrap`` (run as its own process) must not change what a
model gets from ``${env.…}``, which llama-swap pastes into the YAML text before parsing it; and
a model with a fixed proxy *and* ``${PORT}`` in ``cmd`` is refused, saying why."""

import pytest
import yaml

from .conftest import berth_cli, llama_swap_argv, llama_swap_env, split_run

#: Values that a bare ``${env.…}`` would cut (``#``), turn into a mapping (``: ``), fail to load
#: (``@``), or read differently (``\\``, ``"``).
ENV = {"HF_TOKEN": "abc #def", "MAPPED": "a: b", "AT": "@x", "ODD": 'q"uo\\te',
       "PLAIN": "plain-value", "KEY": "k #1", "NAME": "Qwen: 7B"}

SOURCE = """\
macros:
  key: "${env.KEY}"
  single: '${env.ODD}'
models:
  qwen:
    cmd: llama-server --port ${PORT} --api-key ${key} --alias "${env.AT}"
    name: "${env.NAME}"
    env:
      - "HF_TOKEN=${env.HF_TOKEN}"
      - "MAPPED=${env.MAPPED}"
      - 'SINGLE=${single}'
      - PLAIN=${env.PLAIN}
  block:
    cmd: |
      llama-server --port ${PORT}
      --alias "${env.ODD}"
    description: "${env.AT}"
"""


def _loaded(text: str) -> dict:
    """What llama-swap reads from ``text``: env values pasted in, then parsed."""
    return yaml.safe_load(llama_swap_env(text, ENV))


def test_values_from_env_are_the_same_after_wrap():
    done = berth_cli("llama-swap", "wrap", "-", stdin=SOURCE)
    assert done.returncode == 0, done.stderr
    before, after = _loaded(SOURCE), _loaded(done.stdout)
    assert after["macros"] == before["macros"]
    for mid, model in before["models"].items():
        for key, value in model.items():
            if key != "cmd":
                assert after["models"][mid][key] == value, (mid, key)
        head, _, engine = split_run(llama_swap_argv(after, mid))
        assert head[:2] == ["berth", "run"]
        assert engine == [w.replace("${PORT}", "{port}") for w in llama_swap_argv(before, mid)]
    assert before["models"]["qwen"]["env"][:2] == ["HF_TOKEN=abc #def", "MAPPED=a: b"]
    assert "@x" in llama_swap_argv(after, "qwen") and 'q"uo\\te' in llama_swap_argv(after, "block")


def test_an_inlined_macro_brings_its_quotes_into_cmd_or_is_refused_when_they_differ():
    macro = 'macros:\n  listen: "--port ${PORT} --api-key ${env.KEY}"\n'
    used = "    metadata:\n      how: ${listen}\n"     # used outside cmd: put in place
    text = macro + "models:\n  m:\n    cmd: llama-server ${listen}\n" + used
    done = berth_cli("llama-swap", "wrap", "-", stdin=text)
    assert done.returncode == 0, done.stderr
    engine = split_run(llama_swap_argv(_loaded(done.stdout), "m"))[2]
    assert engine == ["llama-server", "--port", "{port}", "--api-key", "k", "#1"]
    assert engine == [w.replace("${PORT}", "{port}")
                      for w in llama_swap_argv(_loaded(text), "m")]
    text = macro + "models:\n  m:\n    cmd: llama-server ${listen} -a ${env.AT}\n" + used
    done = berth_cli("llama-swap", "wrap", "-", stdin=text.replace("${env.AT}", "x${env.AT}"))
    assert done.returncode == 2 and done.stdout == ""
    assert "models.m.cmd: wrapping puts ${env.…} from differently quoted text" in done.stderr
    assert "cmd is plain, macro listen is double-quoted" in done.stderr


@pytest.mark.parametrize("proxy", ["http://127.0.0.1:8080", "http://localhost:8080/v1"])
def test_a_fixed_proxy_with_port_in_cmd_is_refused_saying_which_to_drop(proxy):
    text = f"models:\n  m:\n    cmd: llama-server --port ${{PORT}}\n    proxy: {proxy}\n"
    done = berth_cli("llama-swap", "wrap", "-", stdin=text)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    line = done.stderr.strip()
    assert "models.m.proxy" in line and "is a fixed address, yet cmd also gives the engine " \
        "${PORT}" in line and "take ${PORT} out of cmd" in line and "drop proxy" in line
