"""berthd as a service for other users: ``[api] socket_group`` and ``socket_mode``.

berthd run by root made its socket ``root:root 0660``: llama-swap or ComfyUI running as another
user could not connect, and ``berth run`` then ran its engine unleased. These tests create a
Unix group and two users (the machine runs the tests as root; both are removed after), start
berthd as root with the group named, and run the real ``berth`` command as each user in a child
process (setgid, setgroups, setuid: ``subprocess``'s ``group``/``extra_groups``/``user``)."""

from __future__ import annotations

import grp
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.berthd import Berthd, sim_config, wait_for
from tests.faults.conftest import berth_cmd, make_user  # noqa: F401 (make_user: a fixture)


@pytest.fixture
def make_group():
    """``make_group(*members)`` -> the name of a fresh Unix group with those users in it;
    every group made is removed at the end."""
    if os.geteuid() != 0 or shutil.which("groupadd") is None:
        pytest.fail("needs root and groupadd to create a Unix group (CI runs as root)")
    made: list[str] = []

    def make(*members: str) -> str:
        name = f"bgrp{secrets.token_hex(3)}"
        subprocess.run(["groupadd", name], check=True)
        made.append(name)
        for m in members:
            subprocess.run(["usermod", "-a", "-G", name, m], check=True)
        return name
    yield make
    for name in made:
        subprocess.run(["groupdel", name], check=False)


@pytest.fixture
def public_tmp():
    """A directory under /tmp the test's users can search (pytest's tmp_path is 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix="berth-grp-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _as(user, group_ids: list[int], args: list[str], env: dict, **kw) -> subprocess.Popen:
    """``args`` as ``user`` with its primary group and ``group_ids`` as its only other groups."""
    return subprocess.Popen(args, env=env, user=user.pw_uid, group=user.pw_gid,
                            extra_groups=group_ids, cwd="/", start_new_session=True, **kw)


def _client_env(d: Berthd) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
            "BERTH_SOCKET": str(d.sock), "BERTH_CONFIG": str(d.config),
            "BERTH_STATE_DIR": str(d.tmp / "state")}


def test_a_member_of_socket_group_leases_an_engine_and_others_cannot_connect(
        make_user, make_group, public_tmp):  # noqa: F811 (the fixture imported above)
    member, outsider = make_user(), make_user()
    group = make_group(member.pw_name)
    gid = grp.getgrnam(group).gr_gid
    cfg = sim_config(public_tmp, [("gpu0", "24GiB")], extra=f'[api]\nsocket_group = "{group}"\n')
    d = Berthd(public_tmp, cfg).start()
    run = None
    try:
        st = os.stat(d.sock)
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o660, (st.st_gid, oct(st.st_mode))
        env = _client_env(d)
        # An engine name no config declares: owned by the first lease that takes it.
        engine = f"guest-{secrets.token_hex(3)}"
        run = _as(member, [gid], [*berth_cmd(), "run", "--engine", engine, "--size", "1GiB",
                                  "--require-berthd", "--", "sleep", "600"], env,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lease = wait_for(lambda: run.poll() is None and (d.lease_of(engine) or {}).get("pid")
                         and d.lease_of(engine), 60, f"{member.pw_name}'s lease of {engine}")
        assert lease["shares"][0]["state"] == "active", lease
        assert lease["pid"] is not None
        assert _uid_of(lease["pid"]) == member.pw_uid      # the engine runs as the member
        shown = _as(member, [gid], [*berth_cmd(), "status"], env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
        out, err = shown.communicate(timeout=60)
        assert shown.returncode == 0 and engine in out, out + err
        # Not in the group: the socket refuses the connection.
        other = _as(outsider, [], [*berth_cmd(), "status"], env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
        out, err = other.communicate(timeout=60)
        assert other.returncode == 3 and "ermission denied" in err, (other.returncode, out, err)
        assert "Traceback" not in err
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, 15)
            try:
                run.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, 9)
                run.wait(5)
        d.stop()


def _uid_of(pid: int) -> int:
    import psutil
    return psutil.Process(pid).uids().real


def test_a_socket_group_that_does_not_exist_stops_berthd_in_one_line(tmp_path):
    name = f"nogrp{secrets.token_hex(3)}"
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")], extra=f'[api]\nsocket_group = "{name}"\n')
    d = Berthd(tmp_path, cfg)
    t0 = time.monotonic()
    p = subprocess.run([*_berth(), "daemon", "--config", str(cfg)], env=d.env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and name in lines[0] and "no such group" in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "state" / "berthd.sock").exists()
    assert time.monotonic() - t0 < 60
    # `berth config check` says the same of the file.
    c = subprocess.run([*_berth(), "config", "check", str(cfg)], capture_output=True,
                       text=True, timeout=60)
    assert c.returncode == 2 and name in c.stderr and "no such group" in c.stderr, c.stderr


def _berth() -> list[str]:
    from tests.berthd import BERTH
    return [BERTH]


def test_socket_mode_values():
    from berth.config import ConfigError, parse
    assert parse({}).api.socket_mode == 0o660 and parse({}).api.socket_group is None
    assert parse({"api": {"socket_mode": "0666"}}).api.socket_mode == 0o666
    assert parse({"api": {"socket_mode": 0o600}}).api.socket_mode == 0o600
    for bad, said in (("rw", "'rw'"), (0o1777, "0o1777"), ("0400", "0o400")):
        with pytest.raises(ConfigError) as e:
            parse({"api": {"socket_mode": bad}})
        assert "api.socket_mode" in str(e.value) and said in str(e.value), str(e.value)
    # TOML reads a bare 660 as decimal (0o1224): the error says so and what to write (the
    # value as written first, not only its octal form).
    with pytest.raises(ConfigError) as e:
        parse({"api": {"socket_mode": 660}})
    assert "got 660" in str(e.value) and "write 0o660" in str(e.value), str(e.value)
    with pytest.raises(ConfigError) as e:
        parse({"api": {"socket_group": "llm", "socket_mode": "0640"}})
    assert "could not connect" in str(e.value)
