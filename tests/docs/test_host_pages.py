"""Each host page's commands run as written (issue 37 "Things only the code says"): the shell
blocks of a page's "Try it on a simulated card" section, read from the page, run in an empty
folder with nothing of Berth in the environment but ``PATH``; each block checks its own result
(``grep -q``, ``grep -c``), so the script fails where the page is wrong."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BIN = str(Path(sys.executable).parent)
PAGES = ("llama-swap", "comfyui", "supervisord", "ollama")


def try_script(page: str) -> str:
    """The ``sh`` blocks of the page's "Try it on a simulated card" section, in order."""
    text = (DOCS / "hosts" / f"{page}.md").read_text()
    m = re.search(r"^## Try it on a simulated card\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"docs/hosts/{page}.md has no 'Try it on a simulated card' section"
    blocks = re.findall(r"```sh\n(.*?)```", m.group(1), re.S)
    assert blocks, f"docs/hosts/{page}.md: no sh block to run"
    return "\n".join(blocks)


def _sweep(folder: Path) -> None:
    """SIGKILL what the page started and left (engines lead their own process groups): every
    process whose working directory is the page's folder."""
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.cwd().startswith(str(folder)):
                left.append(proc)
        except (psutil.Error, OSError):
            continue
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=5)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_commands_run_as_written(page, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["HOME"] = str(tmp_path)
    p = subprocess.Popen(["bash", "-euo", "pipefail", "-c", try_script(page)], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        _sweep(tmp_path)
    logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
                     for f in sorted(tmp_path.glob("*.log")))
    assert p.returncode == 0, f"docs/hosts/{page}.md's commands failed ({p.returncode}):\n{out}\n{logs}"


def test_the_glossary_defines_every_field_term():
    text = (DOCS / "glossary.md").read_text()
    for term in ("card", "lease", "share", "reserve", "stowaway", "park", "lend", "drain",
                 "wake", "front"):
        assert re.search(rf"^\*\*{term}\*\*", text, re.M | re.I), f"glossary lacks {term!r}"
