"""``berth config check`` and a card the config names on the NVML driver (a new user's find,
2026-12-04): ``[engines.X] card = 'gpu7'`` passed the check on a machine with two cards, and on
one with no NVIDIA driver, silently. Now NVML's cards are read: a card none of them answers to
is an error naming the key and the value and listing what NVML sees (exit 2); where NVML cannot
be read, a warning names each card the check could not verify. NVML is the patched module of
tests/driver/test_nvml.py, so the test reads the same on a machine with a GPU."""

from __future__ import annotations

import pynvml
import pytest
from berth.cli import main

from tests.berthd import sim_config
from tests.driver.test_nvml import FakeCard, FakeNvml

CARDS = [FakeCard("00000000:05:00.0"), FakeCard("00000000:0A:00.0")]
SEES = "NVML sees: gpu0 (0000:05:00.0), gpu1 (0000:0a:00.0)"


def _check(tmp_path, text: str, capsys) -> tuple[int, str, str]:
    path = tmp_path / "berth.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n{text}')
    rc = main(["config", "check", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_unknown_engine_card_is_an_error_listing_the_cards_nvml_sees(tmp_path, monkeypatch,
                                                                      capsys):
    FakeNvml(monkeypatch, CARDS)
    rc, out, err = _check(tmp_path, '[engines.llm]\nsize = "8GiB"\ncard = "gpu7"\n', capsys)
    assert rc == 2 and out == "", (rc, out, err)
    assert (f"engines.llm.card: no card NVML sees is named 'gpu7' or has that PCI address "
            f"({SEES})") in err, err


def test_an_unknown_cards_entry_is_an_error_too(tmp_path, monkeypatch, capsys):
    FakeNvml(monkeypatch, CARDS)
    rc, out, err = _check(tmp_path, '[cards."0000:07:00.0"]\nreserve = "2GiB"\n', capsys)
    assert rc == 2, (rc, out, err)
    assert """cards."0000:07:00.0": no card NVML sees is named '0000:07:00.0'""" in err, err
    assert SEES in err, err


@pytest.mark.parametrize("card", ["gpu0", "0000:0A:00.0", "a:0.0", "big"])
def test_a_card_nvml_sees_passes(tmp_path, monkeypatch, capsys, card):
    """By its name, any spelling of its PCI address, or the name its [cards.X] entry gives."""
    FakeNvml(monkeypatch, CARDS)
    rc, out, err = _check(tmp_path, f'[cards.gpu1]\nname = "big"\n[engines.llm]\nsize = "8GiB"\n'
                                    f'card = "{card}"\n', capsys)
    assert rc == 0 and ": valid" in out and err == "", (rc, out, err)


def test_a_renamed_cards_old_name_is_an_error_saying_its_new_one(tmp_path, monkeypatch, capsys):
    """berthd calls the card by the name its [cards.X] entry gives: the engine's card must too."""
    FakeNvml(monkeypatch, CARDS)
    rc, out, err = _check(tmp_path, '[cards.gpu1]\nname = "big"\n[engines.llm]\nsize = "8GiB"\n'
                                    'card = "gpu1"\n', capsys)
    assert rc == 2, (rc, out, err)
    assert "engines.llm.card: no card NVML sees is named 'gpu1'" in err, err
    assert "[cards.gpu1] shows it as 'big': use that name or its PCI address" in err, err


def test_without_nvml_each_named_card_is_a_warning(tmp_path, monkeypatch, capsys):
    FakeNvml(monkeypatch, [], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    rc, out, err = _check(tmp_path, '[cards.gpu3]\nreserve = "2GiB"\n[engines.llm]\n'
                                    'size = "8GiB"\ncard = "gpu7"\n', capsys)
    assert rc == 0 and ": valid" in out, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 2, err
    for line, what in zip(lines, ["[cards.gpu3]", "engines.llm.card = 'gpu7'"], strict=True):
        assert f"warning: {what} could not be checked against the driver's cards: no NVIDIA " \
               f"driver was found" in line, err
    assert "Traceback" not in err


def test_no_named_card_reads_no_driver(tmp_path, monkeypatch, capsys):
    fake = FakeNvml(monkeypatch, CARDS)
    rc, out, err = _check(tmp_path, '[engines.llm]\nsize = "8GiB"\n', capsys)
    assert rc == 0 and err == "" and fake.calls == [], (rc, err, fake.calls)


def test_simulated_cards_are_checked_as_before(tmp_path, monkeypatch, capsys):
    """The sim driver's own check (berth.config.cross) stands; NVML is not asked."""
    fake = FakeNvml(monkeypatch, CARDS)
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")], extra='[engines.llm]\nsize = "8GiB"\n'
                                                          'card = "gpu7"\n')
    rc = main(["config", "check", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2 and "engines.llm.card: no simulated card is named 'gpu7'" in err, err
    assert "NVML" not in err and fake.calls == [], (err, fake.calls)
