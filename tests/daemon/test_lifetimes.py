"""berthd's lifetimes: a start that fails leaves nothing behind and says why in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.berthd import BERTH, sim_config


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` with its inode, size and modification time (ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _second(config: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([BERTH, "daemon", "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=30)


def _one_line(out: subprocess.CompletedProcess) -> str:
    text = (out.stdout + out.stderr).strip()
    assert out.returncode != 0, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


def test_a_second_berthd_on_a_socket_another_answers_on_writes_nothing(berthd, tmp_path):
    d = berthd()
    before = _tree(tmp_path)
    del before["berthd.log"]       # the first berthd's own log may grow
    other = tmp_path / "other"
    other.mkdir()
    cfg = sim_config(other, [("gpu0", "24GiB")])
    env = {**d.env, "BERTH_STATE_DIR": str(other / "state"), "BERTH_SIM_DIR": str(other / "sim"),
           "BERTH_CONFIG": str(cfg)}
    line = _one_line(_second(cfg, env))
    assert str(d.sock) in line and "another berthd" in line, line
    assert sorted(p.name for p in other.iterdir()) == ["berth.toml"]    # no state, sim, lock
    assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith("other")
            and k != "berthd.log"} == before
    assert d.call("GET", "/v1/health")[0] == 200


def test_a_second_berthd_on_the_same_state_directory_writes_nothing(berthd, tmp_path):
    d = berthd()
    before = _tree(tmp_path / "state"), _tree(tmp_path / "sim")
    for env in (d.env, {**d.env, "BERTH_SOCKET": str(tmp_path / "elsewhere.sock")}):
        line = _one_line(_second(d.config, env))
        assert "another berthd" in line, line
        assert str(d.proc.pid if env is not d.env else d.sock) in line, line
        assert (_tree(tmp_path / "state"), _tree(tmp_path / "sim")) == before
        assert not (tmp_path / "elsewhere.sock").exists()
    assert d.call("GET", "/v1/health")[0] == 200
    assert (tmp_path / "state" / "berthd.lock").read_text().strip() == str(d.proc.pid)


def test_a_failed_start_after_the_lock_releases_it_and_leaves_no_socket(tmp_path):
    """A driver that cannot be opened (sim dir declared differently): one line, exit non-zero,
    and the state directory this start made (lock, socket, state file) gone again."""
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")])
    env = {**os.environ, "BERTH_STATE_DIR": str(tmp_path / "state"),
           "BERTH_SOCKET": str(tmp_path / "state" / "berthd.sock"),
           "BERTH_SIM_DIR": str(tmp_path / "sim"), "BERTH_CONFIG": str(cfg)}
    subprocess.run([BERTH, "sim", "init", "--card", "gpu0=8GiB"], env=env, check=True,
                   capture_output=True, timeout=30)
    line = _one_line(_second(cfg, env))
    assert "declared differently" in line, line
    assert not (tmp_path / "state").exists()        # made by this start, so taken away again


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sighup_stops_berthd_in_order_as_sigterm_does(berthd, tmp_path, sig):
    """berthd started from a terminal that closes gets SIGHUP: it died of it at once (the
    default action), with no orderly stop: no line in its log, exit -1. It stops as on SIGTERM: in reverse order, exit 0, and its log says which signal; its
    lease is in the state file and a new berthd finds it."""
    d = berthd()
    keep = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        code, r = d.call("POST", "/v1/leases", {"engine": "A", "owner_pid": keep.pid,
                                                "shares": [{"size": "1GiB"}]})
        assert code == 201, r
        d.proc.send_signal(sig)
        assert d.proc.wait(30) == 0, d.log.read_text()
        log = d.log.read_text()
        assert f"berthd stopping ({sig.name})" in log, log
        assert "Traceback" not in log, log
        d.start()
        assert [le["engine"] for le in d.status()["leases"]] == ["A"]
    finally:
        keep.kill()
        keep.wait()
