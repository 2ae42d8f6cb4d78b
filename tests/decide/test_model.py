"""The model's pure data: PCI names, the share state machine, sizes and durations."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from berth.decide.model import (
    DIAGRAM_EDGES,
    TRANSITIONS,
    IllegalTransition,
    Share,
    ShareState,
    move,
    normalize_pci,
)
from berth.decide.units import format_size, parse_duration, parse_size

S = ShareState
CORE = Path(__file__).resolve().parents[2] / "core" / "decide"
# Every module of berth.decide is pure, the ones split out later too.
PURE = tuple(sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__"))


class TestPci:
    @pytest.mark.parametrize("text", ["00000000:05:00.0", "0000:05:00.0", "05:00.0",
                                      "0000:05:00.0 ", b"00000000:05:00.0", "0000:05:00.0".upper()])
    def test_every_spelling_is_one_card(self, text):
        assert normalize_pci(text) == "0000:05:00.0"

    def test_hex_is_lower_case(self):
        assert normalize_pci("00000000:AF:1F.7") == "0000:af:1f.7"

    @pytest.mark.parametrize("bad", ["", "gpu0", "0000:05:00", "0000:05:00.9", "0000:05:20.0"])
    def test_bad_addresses_are_named(self, bad):
        with pytest.raises(ValueError, match="pci"):
            normalize_pci(bad)


class TestStateMachine:
    def test_every_diagram_edge_is_allowed(self):
        for a, b in DIAGRAM_EDGES:
            assert b in TRANSITIONS[a]

    def test_the_diagram_is_the_seeds(self):
        chain = [("waiting", "active"), ("active", "draining"), ("draining", "released"),
                 ("released", "freed"), ("active", "parking"), ("parking", "parked"),
                 ("parked", "resuming"), ("resuming", "active"), ("active", "lending"),
                 ("lending", "lent"), ("lent", "returning"), ("returning", "active")]
        assert {(S(a), S(b)) for a, b in chain} == DIAGRAM_EDGES

    def test_a_share_can_never_be_parked_and_lending_at_once(self):
        assert S.LENDING not in TRANSITIONS[S.PARKED]
        assert S.PARKING not in TRANSITIONS[S.LENT]
        assert S.LENDING not in TRANSITIONS[S.PARKING]

    def test_illegal_edge_raises_and_changes_nothing(self):
        sh = Share("0000:01:00.0", 1)
        with pytest.raises(IllegalTransition, match="waiting -> parked"):
            move(sh, S.PARKED, 1.0)
        assert sh.state is S.WAITING and sh.history == []

    def test_move_records_the_edge_and_time(self):
        sh = Share("0000:01:00.0", 1)
        move(sh, S.ACTIVE, 2.5)
        assert sh.history == [(S.WAITING, S.ACTIVE, 2.5)] and sh.since == 2.5


class TestUnits:
    @pytest.mark.parametrize("text,n", [("24GiB", 24 << 30), ("512MiB", 512 << 20),
                                        ("1.5GiB", 3 << 29), ("24GB", 24 * 10**9), ("100", 100),
                                        ("2g", 2 << 30), (7, 7)])
    def test_sizes(self, text, n):
        assert parse_size(text) == n

    def test_card_is_a_size_where_allowed(self):
        assert parse_size("card", allow_card=True) is None
        with pytest.raises(ValueError, match="reserve: 'card' is not allowed"):
            parse_size("card", field="reserve")

    @pytest.mark.parametrize("bad", ["", "-1GiB", "24 parsecs", "GiB", "1e3GiB", True])
    def test_bad_sizes_name_the_field_and_value(self, bad):
        with pytest.raises(ValueError, match="cards.gpu0.reserve"):
            parse_size(bad, field="cards.gpu0.reserve")

    @pytest.mark.parametrize("text,s", [("20s", 20.0), ("500ms", 0.5), ("2m", 120.0),
                                        ("1h30m", 5400.0), ("3", 3.0), (1.5, 1.5)])
    def test_durations(self, text, s):
        assert parse_duration(text) == s

    @pytest.mark.parametrize("bad", ["", "soon", "10 parsecs", "-3s", "5s5"])
    def test_bad_durations(self, bad):
        with pytest.raises(ValueError, match="policy.release_grace"):
            parse_duration(bad, field="policy.release_grace")

    @pytest.mark.parametrize("parse,bad", [(parse_size, "-1GiB"), (parse_size, " -2 MiB"),
                                           (parse_duration, "-5s"), (parse_duration, "-1h30m")])
    def test_a_negative_value_is_called_negative(self, parse, bad):
        """A new user's `--size -1GiB` was told only "expected a size like '24GiB'"."""
        with pytest.raises(ValueError, match=f"--x: a .* cannot be negative, got '{bad}'"):
            parse(bad, field="--x")

    def test_format(self):
        assert format_size(24 << 30) == "24.0GiB" and format_size(None) == "card"


class TestPurity:
    def test_pure_modules_import_no_io_libraries(self):
        code = ("import sys\n" + "".join(f"import berth.decide.{m}\n" for m in PURE) +
                "bad = [m for m in ('aiohttp', 'pynvml', 'psutil', 'asyncio', 'socket') "
                "if m in sys.modules]\nprint(','.join(bad))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == "", f"pure modules pulled in {out}"

    @pytest.mark.parametrize("mod", PURE)
    def test_pure_modules_read_no_clock_and_do_no_io(self, mod):
        tree = ast.parse((CORE / f"{mod}.py").read_text())
        allowed = {"__future__", "abc", "bisect", "dataclasses", "enum", "itertools", "re",
                   "typing", "collections", "functools", "math", "heapq"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("open", "print"):
                raise AssertionError(f"{mod} calls {node.func.id}")
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:          # relative: another berth module
                    # ``from . import rooms`` names the modules; ``from .rooms import x`` one.
                    found = [a.name for a in node.names] if node.module is None \
                        else [node.module]
                    assert set(found) <= set(PURE), f"{mod} imports .{found}"
                    continue
                names = [node.module.split(".")[0]]
            else:
                continue
            for n in names:
                assert n in allowed, f"{mod} imports {n}"


def test_only_the_ledger_moves_a_share():
    """Every share move goes through ``Ledger.move``, which keeps each card's count exact
    (issue 23: the restart settling moved shares with the raw ``model.move``)."""
    movers = []
    for mod in PURE:
        for node in ast.walk(ast.parse((CORE / f"{mod}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "model" \
                    and any(a.name == "move" for a in node.names):
                movers.append(mod)
    assert movers == ["ledger"]


def test_the_scheduler_is_one_class():
    """One class you can read, its helpers plain functions (issue 23)."""
    from berth.decide.scheduler import Scheduler
    assert Scheduler.__mro__ == (Scheduler, object)
