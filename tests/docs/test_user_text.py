"""What a user reads says sizes in human units and no design or tracker jargon.

Every page of ``berth --help`` (each subcommand, each nested one), the messages of a set of
real error paths and of a real berthd's scene (``berth run``'s grant line, a lease too large for
any card, a waiter whose process already holds memory, ``berth status``, berthd's own log and
its timeline), the board's static files, and the user docs (README.md, hosts/*/README.md,
docs/*.md but the design documents) are searched for:

- a byte count of 9 or more digits (``6442450944``, or ``6,442,450,944``): a reader cannot
  tell 6 GiB from 60 at a glance; sizes go through ``berth.decide.units.format_size``;
- design or tracker words (``seed 000``, ``issue 13``, a ``shared/`` folder the repository does
  not have): they are for code comments, where the design documents are.

Each source is checked to be non-empty first, so a path that stopped producing text fails
rather than passing on nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.berthd import BERTH, Berthd, api, berth_run, sim_config, stop_proc, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: A byte count: 9 or more digits alone (not part of a word, a version or a hex id), or written
#: with thousands separators (6,442,450,944).
BYTES = re.compile(r"(?<![\w.:/#-])\d{9,}(?![\w.])|(?<![\w.])\d{1,3}(?:,\d{3}){3,}(?![\w.])")
JARGON = re.compile(r"\bseed 0\d*|\bissues? \d+|shared/", re.I)
#: Design documents (the code cites them; they may speak of seeds and issues).
DESIGN_DOCS = {"DESIGN.md", "README.md"}


def problems(where: str, text: str) -> list[str]:
    """Each byte count and jargon word in ``text``, with its line, as ``where: …``."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for rx, what in ((BYTES, "byte count"), (JARGON, "jargon")):
            for m in rx.finditer(line):
                out.append(f"{where}:{n}: {what} {m.group(0)!r} in {line.strip()[:160]!r}")
    return out


def test_the_checks_catch_what_they_are_for():
    """The patterns themselves: each example the issue quotes is caught, ordinary text is not."""
    caught = ["gpu0=6442450944", "holds 12079595520 bytes", "53687091200 bytes is larger",
              "1,073,741,824 bytes", "seed 000 counters", "seed 002 'Capabilities'",
              "issue 13", "see shared/reference/hosts.md", "Issues 13 and 28"]
    for text in caught:
        assert problems("x", text), text
    fine = ["6.0GiB", "pid 4250", "2,000 requests", "0000:01:00.0", "sha 9c30aab1234567890",
            "v1.2.345678901", "gen.py seeds 1..5", "12 GiB", "berth-demo-123"]
    for text in fine:
        assert not problems("x", text), (text, problems("x", text))


# -- the command's help pages ---------------------------------------------------------------------

def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in p._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def help_pages() -> dict[str, str]:
    """``berth --help`` and every subcommand's help page, nested ones too, as the parser
    prints them (each command's module fills its own parser: berth.cli's table)."""
    from berth.cli import COMMANDS, build_parser
    pages = {"berth --help": build_parser().format_help()}

    def walk(name: str, p: argparse.ArgumentParser) -> None:
        pages[f"{name} --help"] = p.format_help()
        for sub_name, sub in _subparsers(p).items():
            walk(f"{name} {sub_name}", sub)

    for cmd in COMMANDS:
        walk(f"berth {cmd.name}", _subparsers(build_parser([cmd.name]))[cmd.name])
    return pages


def test_help_pages():
    pages = help_pages()
    assert len(pages) > 20, sorted(pages)
    found = [p for name, text in pages.items() for p in problems(name, text)]
    assert not found, "\n".join(found)
    # The pages as the installed command prints them, too (the script's own entry).
    out = subprocess.run([BERTH, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: berth" in out.stdout
    assert not problems("berth --help (process)", out.stdout)


# -- the board's files and the user docs ---------------------------------------------------------

def user_docs() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "hosts").glob("*/README.md")),
            *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in DESIGN_DOCS)]
    return docs


def test_board_files_and_user_docs():
    static = sorted((ROOT / "core/daemon/board_web/static").iterdir())
    assert {p.name for p in static} >= {"index.html", "page.js", "page.css"}
    docs = user_docs()
    assert len(docs) >= 4, docs
    found = []
    for path in static + docs:
        text = path.read_text()
        assert text.strip(), path
        found += problems(str(path.relative_to(ROOT)), text)
        found += [f"{path.relative_to(ROOT)}: link to {m.group(1)!r}, which the repository "
                  f"does not have" for m in re.finditer(r"\]\(([^)#]+)\)", text)
                  if "://" not in m.group(1)
                  and not (path.parent / m.group(1)).resolve().exists()]
    assert not found, "\n".join(found)


# -- messages: real error paths and a real berthd's scene ---------------------------------------

def _run(args: list[str], env: dict, cwd: Path, timeout: float = 60) -> str:
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in p.stderr, p.stderr
    return p.stdout + p.stderr


BAD_CONFIGS = {
    # an engine entry that parks by checkpoint (its message once cited the design's sections)
    "checkpoint-entry.toml": '[engines.a]\nfront = "127.0.0.1:9000"\npark = "checkpoint"\n',
    "hook-no-adapter.toml": '[engines.a]\nfront = "127.0.0.1:9000"\npark = "hook"\n',
    "reserve-too-big.toml": ('[driver]\nkind = "sim"\n[[driver.cards]]\nname = "gpu0"\n'
                             'total = "8GiB"\n[cards.gpu0]\nreserve = "9GiB"\n'),
    "too-big.toml": ('[driver]\nkind = "sim"\n[[driver.cards]]\nname = "gpu0"\ntotal = "8GiB"\n'
                     '[cards.gpu0]\nreserve = "1GiB"\nclaims = { x = "3GiB" }\n'
                     '[engines.a]\nsize = "50GiB"\n'),
    "bad-values.toml": ('[policy]\nmin_turn = "soon"\nram_budget = "lots"\n[api]\n'
                        'tcp = "0.0.0.0:1"\n[board]\nkey = "short"\n'),
}


def test_error_paths(tmp_path):
    env = {**os.environ, "BERTH_STATE_DIR": str(tmp_path / "state"),
           "BERTH_SOCKET": str(tmp_path / "none.sock"), "BERTH_CONFIG": str(tmp_path / "c.toml")}
    (tmp_path / "c.toml").write_text("")
    texts: dict[str, str] = {}
    for name, body in BAD_CONFIGS.items():
        (tmp_path / name).write_text(body)
        texts[f"berth config check {name}"] = _run([BERTH, "config", "check", name], env,
                                                   tmp_path)
    runs = {
        "berth status (no berthd)": [BERTH, "status"],
        "berth park (no berthd)": [BERTH, "park", "nobody"],
        "berth run --size 14": [BERTH, "run", "--size", "14", "--", "true"],
        "berth run --front bad": [BERTH, "run", "--front", "nowhere", "--", "true"],
        "berth sim init --card bad": [BERTH, "sim", "init", "--card", "gpu0",
                                      "--dir", str(tmp_path / "sim")],
        "berth sim init": [BERTH, "sim", "init", "--card", "gpu0=24GiB",
                           "--dir", str(tmp_path / "sim")],
        "berth sim cards": [BERTH, "sim", "cards", "--dir", str(tmp_path / "sim")],
        "berthd (bad config)": [BERTH, "daemon", "--config", str(tmp_path / "too-big.toml")],
    }
    for name, args in runs.items():
        texts[name] = _run(args, env, tmp_path)
    for name, text in texts.items():
        assert text.strip(), f"{name} said nothing"
    big = texts["berth config check too-big.toml"]
    assert "50" in big, big
    found = [p for name, text in texts.items() for p in problems(name, text)]
    assert not found, "\n".join(found)


@pytest.fixture
def scene(tmp_path):
    """berthd on a simulated 24 GiB card: engine ``big`` (priority 5, 14 GiB) serves under
    ``berth run``; ``late``, whose process already runs and holds memory, waits behind it."""
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "24GiB")])).start()
    procs = [berth_run(d, "big", "--size", "14GiB", "--priority", "5", weights="6GiB")]
    try:
        wait_for(lambda: d.state_of("big") == "active", 30, "big active")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        late = subprocess.Popen([BERTH, "sim", "engine", "--port", str(port), "--weights", "2GiB",
                                 "--card", "gpu0", "--dir", str(tmp_path / "sim")],
                                env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        procs.append(late)
        from berth.sim.cards import SimCards
        sim = SimCards(tmp_path / "sim")
        wait_for(lambda: late.pid in sim.snapshot().cards[0].processes, 30, "late on the card")
        code, out = api(d.sock, "POST", "/v1/leases", {
            "engine": "late", "pid": late.pid, "owner_pid": os.getpid(),
            "shares": [{"card": "gpu0", "size": "12GiB"}]})
        assert code == 201 and out["state"] == "waiting", out
        yield d
    finally:
        for p in procs:
            stop_proc(p)
        d.stop()


def test_a_berthd_scene(scene, tmp_path):
    d = scene
    texts: dict[str, str] = {}
    wait_for(lambda: any(w.get("note") for w in d.status()["waiting"]), 30,
             "the waiter's note that its process already holds memory")
    texts["berth status"] = _run([BERTH, "status"], d.env, tmp_path)
    assert "waiting:" in texts["berth status"] and "late" in texts["berth status"]
    texts["berth run --size 50GiB"] = _run([BERTH, "run", "--engine", "huge", "--size", "50GiB",
                                            "--require-berthd", "--", "true"], d.env, tmp_path)
    assert "larger" in texts["berth run --size 50GiB"], texts["berth run --size 50GiB"]
    st = d.status()
    texts["status notes"] = "\n".join(
        str(x.get(k) or "") for x in st["waiting"] + st["leases"] for k in ("why", "note"))
    texts["timeline"] = "\n".join(e.get("text") or "" for e in d.timeline())
    texts["berth run big (its log)"] = (tmp_path / "run-big.log").read_text()
    assert "grant" in texts["berth run big (its log)"], texts["berth run big (its log)"]
    texts["berthd's log"] = d.log.read_text()
    for name, text in texts.items():
        assert text.strip(), f"{name} said nothing"
    found = [p for name, text in texts.items() for p in problems(name, text)]
    assert not found, "\n".join(found)


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module but its docstrings (messages, log lines, help, the
    parts of f-strings), with its line."""
    import ast
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_message_in_the_code_carries_design_words():
    """Every message the code can say, said or not by the paths above: string literals of
    core/, berth_plugins/ and hosts/ (comments and docstrings are where the design is cited)."""
    found, seen = [], 0
    for top in ("core", "berth_plugins", "hosts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, text in _string_constants(path):
                seen += 1
                found += [f"{path.relative_to(ROOT)}:{line}: {p.split(': ', 1)[1]}"
                          for p in problems("", text) if "jargon" in p]
    assert seen > 1000, seen
    assert not found, "\n".join(found)


def test_berth_run_help_says_each_default_as_the_run_resolves_it():
    """``berth run --help`` said the cuda-checkpoint is looked for "on PATH, or
    $BERTH_CUDA_CHECKPOINT" (the run takes the variable first), and gave no default for
    ``--bound`` or ``--health``."""
    import re
    page = " ".join(help_pages()["berth run --help"].split())
    assert re.search(r"--checkpoint-path \S+ cuda-checkpoint to use \(default: "
                     r"\$BERTH_CUDA_CHECKPOINT, else cuda-checkpoint on PATH\)", page), page
    assert "default: the engine's [engines.X] bound, else declared" in page, page
    assert "(default /health)" in page, page
