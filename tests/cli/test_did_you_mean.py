"""A misspelled flag or subcommand (a new user's find, 2026-12-04): ``berth run --sise 8GiB``
answered with ``berth``'s own usage and "unrecognized arguments: --sise", no hint. Now the
subcommand that got the word refuses it, with its own usage and the option or name it likely
misspells, exit 2 as argparse's other refusals."""

from __future__ import annotations

import subprocess

import pytest

from tests.berthd import BERTH


def _berth(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,usage,hint", [
    (["run", "--sise", "8GiB", "--", "true"], "usage: berth run ",
     "berth run: error: unrecognized arguments: --sise (did you mean --size?)"),
    (["run", "--sise=8GiB", "--", "true"], "usage: berth run ",
     "berth run: error: unrecognized arguments: --sise=8GiB (did you mean --size?)"),
    (["status", "--jsn"], "usage: berth status ",
     "berth status: error: unrecognized arguments: --jsn (did you mean --json?)"),
    # a required flag misspelled: argparse says it is missing before it looks at unknown words
    (["sim", "engine", "--port", "8000", "--wieghts", "1GiB"], "usage: berth sim engine ",
     "berth sim engine: error: the following arguments are required: --weights; unrecognized: "
     "--wieghts (did you mean --weights?)"),
])
def test_a_misspelled_flag_gets_its_subcommands_usage_and_the_likely_flag(args, usage, hint):
    p = _berth(*args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(usage), p.stderr
    assert p.stderr.splitlines()[-1] == hint, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


@pytest.mark.parametrize("args,usage,hint", [
    (["stauts"], "usage: berth [", "argument COMMAND: invalid choice: 'stauts' (did you mean "
                                   "'status'?"),
    (["config", "chekc"], "usage: berth config ", "argument ACTION: invalid choice: 'chekc' "
                                                  "(did you mean 'check'?"),
    (["run", "--park", "chekpoint", "--", "true"], "usage: berth run ",
     "argument --park: invalid choice: 'chekpoint' (did you mean 'checkpoint'?"),
])
def test_a_misspelled_subcommand_or_choice_names_the_likely_one(args, usage, hint):
    p = _berth(*args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(usage) and hint in p.stderr, p.stderr


@pytest.mark.parametrize("args", [["status", "--zzzzzz"],
                                  # "--bogus" was "like" "--host" while the dashes counted
                                  ["sim", "engine", "--port", "1", "--weights", "1GiB", "--bogus"]])
def test_a_word_like_no_option_gets_no_guess(args):
    p = _berth(*args)
    usage = "usage: berth " + " ".join(args[:2] if args[0] == "sim" else args[:1]) + " "
    assert p.returncode == 2 and p.stderr.startswith(usage), p.stderr
    assert p.stderr.splitlines()[-1].endswith(f"unrecognized arguments: {args[-1]}"), p.stderr
