"""Issue 34 against the real ``llama-server``: the slots ``berth run`` reads from its command line
are the ones it says in ``GET /props`` (``total_slots``), with ``-np`` given, from its
environment, and left automatic."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import urllib.request

import aiohttp
import pytest
from berth.run.slots import from_command, from_props

from bench.realswap import wait_until

pytestmark = pytest.mark.real


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("args, env", [
    (["-np", "3"], {}),
    (["--parallel", "1"], {}),
    ([], {"LLAMA_ARG_N_PARALLEL": "2"}),
    ([], {}),                                 # automatic
], ids=["np-3", "parallel-1", "env-2", "auto"])
def test_the_command_line_says_what_props_says(real_tools, tmp_path, args, env):
    port = _port()
    cmd = [str(real_tools.llama_server), "-m", str(real_tools.models / "tiny-a.gguf"),
           "--port", str(port), "-c", "256", "-t", "1", *args]
    full_env = {k: v for k, v in os.environ.items() if k != "LLAMA_ARG_N_PARALLEL"} | env
    with open(tmp_path / "llama-server.log", "wb") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: p.poll() is not None or _healthy(url), 60, "llama-server's health")
        assert p.poll() is None, (tmp_path / "llama-server.log").read_text()[-2000:]

        async def measured():
            async with aiohttp.ClientSession() as http:
                return await from_props(http, url)
        props = asyncio.run(measured())
        said, _ = from_command(cmd, full_env)
        assert props is not None and props == said, (props, said)
    finally:
        p.terminate()
        p.wait(10)
