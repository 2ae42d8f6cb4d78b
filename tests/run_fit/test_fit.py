"""``berth run`` bounds a llama-server to its lease (issue 37 "llama-server sizes itself to
what is free"): ``--fit-target`` from the card's free memory at the grant less the lease; a
command that pins its fit is left as written; a pinned context larger than the lease is said."""

from __future__ import annotations

import re
import subprocess
import urllib.request

import pytest
from berth.run import fit

from tests.berthd import BERTH, GiB, stop_proc, wait_for
from tests.helpers import free_port

MiB = 1 << 20
CARD = [{"name": "gpu0", "bytes": 2 * GiB, "free_bytes": 20 * GiB}]


def test_an_unpinned_llama_server_gets_the_lease_as_its_fit():
    cmd = ["env", "X=1", "/opt/llama-server", "-m", "m.gguf", "--port", "9"]
    out, line = fit.bound(cmd, CARD, {})
    assert out == ["env", "X=1", "/opt/llama-server", "--fit-target", str(18 * 1024),
                   "-m", "m.gguf", "--port", "9"]
    assert "bounded to its lease" in line and "2.0GiB" in line
    two = CARD + [{"name": "gpu1", "bytes": 1 * GiB, "free_bytes": 3 * GiB}]
    assert fit.bound(["llama-server"], two, {})[0][2] == f"{18 * 1024},{2 * 1024}"


@pytest.mark.parametrize("cmd,env", [
    (["llama-server", "--fit", "off"], {}),
    (["llama-server", "-fitt=512"], {}),
    (["llama-server", "-ngl", "99", "--ctx-size", "8192"], {}),
    (["env", "LLAMA_ARG_FIT=off", "llama-server"], {}),
    (["llama-server"], {"LLAMA_ARG_FIT_TARGET": "2048"}),
])
def test_a_command_that_pins_its_fit_is_left_alone(cmd, env):
    assert fit.pinned(cmd, env)
    assert fit.bound(cmd, CARD, env) == (cmd, None)


def test_other_commands_and_unknown_free_memory_are_left_alone():
    assert fit.bound(["vllm", "serve", "m"], CARD, {}) == (["vllm", "serve", "m"], None)
    cards = [{"name": "gpu0", "bytes": 2 * GiB, "free_bytes": None}]
    assert fit.bound(["llama-server"], cards, {}) == (["llama-server"], None)


@pytest.mark.real
def test_a_pinned_context_past_the_lease_is_said(real_tools):
    m = str(real_tools.models / "tiny-a.gguf")
    small = [{"name": "gpu0", "bytes": 1 * GiB, "free_bytes": 20 * GiB}]
    said = fit.mismatch(["llama-server", "-m", m, "-c", "400000"], small, {})
    assert said and "more than its lease of 1.0GiB" in said and "declare --size" in said
    assert fit.mismatch(["llama-server", "-m", m, "-c", "2048"], small, {}) is None


@pytest.mark.real
def test_the_real_llama_server_starts_with_a_bound_from_its_lease(berthd, runs, real_tools):
    d = berthd()
    free = d.status()["cards"][0]["free_bytes"]
    front, log = free_port(), d.tmp / "run-tiny.log"
    runs.append(subprocess.Popen(
        [BERTH, "run", "--engine", "tiny", "--size", "2GiB", "--front", f"127.0.0.1:{front}",
         "--", str(real_tools.llama_server), "-m", str(real_tools.models / "tiny-a.gguf"),
         "--port", "{port}", "-t", "1"],
        env=d.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True))

    def serving():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{front}/health", timeout=5) as r:
                return r.status == 200 and "is serving" in log.read_text()
        except OSError:
            return False
    wait_for(serving, 90, "the real llama-server serving behind its front")
    text = log.read_text()
    want = (free - 2 * GiB) // MiB
    assert f"llama-server bounded to its lease: --fit-target {want} MiB" in text, text
    started = re.search(r"started tiny as pid \d+: (.*)", text).group(1)
    assert f"llama-server --fit-target {want} -m" in started, started
    assert stop_proc(runs[-1]) is not None
