"""Fixtures for the fault tests: second Unix users made by the test, and a berthd whose socket
such a user can reach, stopped whatever the outcome. The ``berthd`` and ``runs`` fixtures are the
suite's (tests/fixtures.py).

The short forms run in the default suite; ``BERTH_RELIABILITY=long`` selects the long forms."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.berthd import Berthd, sim_config
from tests.helpers import run_marks, stop_all

LONG = os.environ.get("BERTH_RELIABILITY") == "long"


def _needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.fail("running as root but useradd is missing: install passwd (shadow-utils)")


@pytest.fixture
def make_user():
    """``make_user()`` → ``pwd.struct_passwd`` of a fresh Unix user (no home, no login); every
    one is removed at the end, with what it left in /tmp."""
    _needs_root()
    made: list[str] = []

    def make() -> pwd.struct_passwd:
        name = f"brel{secrets.token_hex(3)}"
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True)
        made.append(name)
        return pwd.getpwnam(name)
    yield make
    for name in made:
        uid = pwd.getpwnam(name).pw_uid
        for p in psutil.process_iter(["uids"]):     # what the test ran as that user, by pid
            if p.info["uids"] and p.info["uids"].real == uid:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        p = Path(f"/tmp/berth-{uid}")
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.exists():
            shutil.rmtree(p, ignore_errors=True)
        subprocess.run(["userdel", name], check=False)


def as_user(user: pwd.struct_passwd, args: list[str], env: dict | None = None,
            timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """Run ``args`` as ``user`` (its uid and primary group, no other groups)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            **run_marks()}      # so that a SIGTERM to pytest ends these too
    return subprocess.run(args, env={**base, **(env or {})}, user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[], capture_output=True, text=True,
                          timeout=timeout, cwd="/", **kw)


def berth_cmd() -> list[str]:
    """``berth`` as another user can start it: this venv's interpreter may sit under /root
    (mode 0700), so the system's Python of the same minor version runs it with this venv's
    site-packages (their extensions are built for that version)."""
    import sys
    import sysconfig
    site = sysconfig.get_paths()["purelib"]
    py = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin")
    probe = subprocess.run([py, "-c", "import sys;print(sys.version_info[:2])"],
                           capture_output=True, text=True) if py else None
    if probe is None or probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.fail(f"no system python3 of version {sys.version_info[:2]} to run berth as "
                    f"another user (found {py}: {probe and probe.stdout.strip()})")
    boot = (f"import site,sys;site.addsitedir({site!r});sys.argv[0]='berth';"
            "from berth.cli import main;sys.exit(main())")
    return [py, "-c", boot]


@pytest.fixture
def public_dir():
    """A directory under /tmp every user can read (pytest's own tmp_path is root's, 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix="berth-rel-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def shared_berthd():
    """A berthd run by root whose socket another user can reach (mode 0666 on the socket, the
    directories searchable): the position of a member of the socket's group."""
    made: list[Berthd] = []
    dirs: list[str] = []

    def make(cards=(("gpu0", "24GiB"),), extra: str = "", **kw) -> Berthd:
        tmp = Path(tempfile.mkdtemp(prefix="berth-rel-", dir="/tmp"))
        dirs.append(str(tmp))
        os.chmod(tmp, 0o755)
        d = Berthd(tmp, sim_config(tmp, list(cards), extra=extra, **kw)).start()
        os.chmod(tmp / "state", 0o755)
        os.chmod(d.sock, 0o666)
        made.append(d)
        return d
    yield make
    for d in made:
        stop_all([d.proc], d.tmp)
    for p in dirs:
        shutil.rmtree(p, ignore_errors=True)
