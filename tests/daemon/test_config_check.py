"""Issue 12 case 7, the config's share: ``berth config check`` on a directory or on a file that
is not UTF-8 says so instead of a traceback, and a simulated card needs no ``pci`` (berth sim
init picks one). How each failed on main before its fix is in the test's docstring."""

from __future__ import annotations

import subprocess

from tests.berthd import BERTH, Berthd, sim_config


def _check(tmp_path, path) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "config", "check", str(path)], capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)


def _refused(tmp_path, text: str) -> str:
    """``berth config check`` of a berth.toml holding ``text``: exit 2 without a traceback.
    Returns its stderr."""
    cfg = tmp_path / "berth.toml"
    cfg.write_text(text)
    r = _check(tmp_path, cfg)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_config_check_of_a_directory_or_bad_bytes_is_an_error_not_a_traceback(tmp_path):
    """Main: ``berth config check DIR`` and a berth.toml that is not UTF-8 ended in
    tracebacks."""
    r = _check(tmp_path, tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "directory" in r.stderr, r.stderr
    bad = tmp_path / "berth.toml"
    bad.write_bytes(b'state_dir = "caf\xe9"\n')
    r = _check(tmp_path, bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "UTF-8" in r.stderr, r.stderr


def test_a_simulated_card_needs_no_pci(tmp_path):
    """Main: ``[[driver.cards]]`` without ``pci`` was refused, though ``berth sim init`` picks
    one (0000:01:00.0 for the first card)."""
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")])
    cfg.write_text(cfg.read_text().replace('pci = "0000:01:00.0"\n', ""))
    r = _check(tmp_path, cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0000:01:00.0" in r.stdout, r.stdout
    d = Berthd(tmp_path, cfg).start()
    try:
        assert d.status()["cards"][0]["pci"] == "0000:01:00.0"
    finally:
        d.stop()


def test_config_check_without_a_path_checks_the_file_berthd_reads(tmp_path):
    """Main: ``berth config check`` needed a path, so the place berthd reads could not be
    checked as it is found, and ``--help`` said "the usual place" without naming it."""
    import os

    from berth import paths
    env = {k: v for k, v in os.environ.items() if k not in ("BERTH_CONFIG", "XDG_CONFIG_HOME")}
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")])
    named = subprocess.run([BERTH, "config", "check"], capture_output=True, text=True,
                           timeout=30, env={**env, "BERTH_CONFIG": str(cfg)})
    assert named.returncode == 0, named.stderr
    assert named.stdout.startswith(f"{cfg}: valid") and "gpu0" in named.stdout, named.stdout
    cfg.write_text(cfg.read_text().replace('total = "24GiB"', 'total = "lots"'))
    bad = subprocess.run([BERTH, "config", "check"], capture_output=True, text=True,
                         timeout=30, env={**env, "BERTH_CONFIG": str(cfg)})
    assert bad.returncode == 2 and "lots" in bad.stderr, bad.stderr
    gone = subprocess.run([BERTH, "config", "check"], capture_output=True, text=True,
                          timeout=30, env={**env, "BERTH_CONFIG": str(tmp_path / "nope.toml")})
    assert gone.returncode == 2 and "no such file (named by BERTH_CONFIG)" in gone.stderr
    # Nothing named: the default place, which the answer names (present or not).
    default = subprocess.run([BERTH, "config", "check"], capture_output=True, text=True,
                             timeout=30, env=env, cwd=tmp_path)
    place = str(paths.config_path())
    assert default.stdout.startswith(place) or place in default.stderr, default
    if not os.path.exists(place):
        assert default.returncode == 0 and "berthd runs on the defaults" in default.stdout
    for args in (["daemon", "--help"], ["config", "check", "--help"], ["--help"]):
        page = subprocess.run([BERTH, *args], capture_output=True, text=True, timeout=30,
                              env=env).stdout
        flat = " ".join(page.split())
        assert "/etc/berth/berth.toml" in flat and "~/.config/berth/berth.toml" in flat, page
        assert "usual place" not in flat
    from berth.cli import CONFIG_PLACES
    assert CONFIG_PLACES == paths.CONFIG_PLACES


def test_a_size_in_bits_is_refused_by_name(tmp_path):
    """``size = "14Gb"`` read as 14 GB (13.0GiB) without a word, and ``berth run --size 14Gb``
    alike: ``Gb`` is gigabits. It is refused with the field, the value and the units meant;
    ``GB`` and ``gb`` stay decimal bytes and ``GiB`` binary."""
    said = _refused(tmp_path, '[engines.qwen]\nsize = "14Gb"\n[engines.coder]\nsize = "14gb"\n')
    assert "engines.qwen.size" in said and "'14Gb'" in said, said
    assert "bits" in said and "GiB" in said, said
    assert "engines.coder" not in said, said
    run = subprocess.run([BERTH, "run", "--engine", "x", "--size", "2Mb", "--", "true"],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert run.returncode == 2 and "--size" in run.stderr and "'2Mb'" in run.stderr, run.stderr


def test_a_bad_ram_budget_names_auto(tmp_path):
    """Main: ``ram_budget = "200%"`` said ``expected a size like '24GiB' or '512MiB'`` and left
    out that ``"auto"`` (the default) is allowed too."""
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")], policy={"ram_budget": "200%"})
    r = _check(tmp_path, cfg)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert "policy.ram_budget" in said and "'200%'" in said and "'auto'" in said, said


def test_a_size_with_a_card_in_berth_toml_says_card_is_its_own_key(tmp_path):
    """``size = "14GiB@gpu1"`` in an ``[engines.X]`` entry, the README's ``--size 14GiB@gpu1``
    copied into berth.toml (a new user's find), said only ``expected a size like '24GiB' or
    '512MiB'``: nothing said where the card goes. The line names the field, the value and the
    entry's own ``card`` key, with the two values split."""
    said = _refused(tmp_path, '[engines.qwen]\nsize = "14GiB@gpu1"\n')
    assert "engines.qwen.size" in said and "'14GiB@gpu1'" in said, said
    assert "size = \"14GiB\"" in said and "card = \"gpu1\"" in said, said
