"""A flood on the control socket (issue 36): berthd started with the soft descriptor limit most
services get (1024, systemd's default); a member of the socket group (a second uid) opens 1,500
idle connections. Root's ``berth status`` failed 15 of 15 tries and berthd wrote 25 MB of
tracebacks. Now: root's status answers within 2 s during the flood, the log grows by less than
1 MB, berthd's memory stays bounded; the flood is refused at the member's bound, said in one
line with the count."""

from __future__ import annotations

import grp
import os
import resource
import subprocess
import time
from pathlib import Path

import psutil
from berth.daemon.guard import PER_UID, ControlBounds

from tests.berthd import BERTH, Berthd, api, sim_config, wait_for
from tests.daemon.test_socket_group import make_group, public_tmp  # noqa: F401 (fixtures)
from tests.faults.conftest import make_user  # noqa: F401 (a fixture)
from tests.helpers import slowness

FLOODER = str(Path(__file__).with_name("flooder.py"))
SYS_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def _start_at_1024(d: Berthd) -> Berthd:
    """Start ``d`` with a soft RLIMIT_NOFILE of 1024 (inherited from this process for the
    spawn only)."""
    was = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, was[1]))
    try:
        return d.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, was)


def test_a_flood_from_a_socket_group_member_leaves_root_its_status(
        make_user, make_group, public_tmp):  # noqa: F811 (fixtures imported above)
    member = make_user()
    group = make_group(member.pw_name)
    gid = grp.getgrnam(group).gr_gid
    cfg = sim_config(public_tmp, [("gpu0", "24GiB")], extra=f'[api]\nsocket_group = "{group}"\n')
    d = _start_at_1024(Berthd(public_tmp, cfg))
    flood = None
    try:
        me = psutil.Process(d.proc.pid)
        rss_before, log_before = me.memory_info().rss, d.log.stat().st_size
        flood = subprocess.Popen([SYS_PY, FLOODER, str(d.sock), "1500"], user=member.pw_uid,
                                 group=member.pw_gid, extra_groups=[gid], cwd="/",
                                 env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        said = flood.stdout.readline().split()
        assert said[:1] == ["open"], said
        # During the flood (the member holds what it opened): root's status, 5 times.
        for _ in range(5):
            status, body = _status_within(d, 2.0 * slowness())
            assert status == 200 and body["cards"], body
        out = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "gpu0" in out.stdout, out.stderr
        assert len(me.net_connections("unix")) < PER_UID + 64, "the member held more than its bound"
        grown = d.log.stat().st_size - log_before
        text = d.log.read_text()
        assert grown < 1 << 20, grown
        assert "Traceback" not in text, text[-4000:]
        assert f"uid {member.pw_uid}:" in text and "refused at their bound" in text, text[-4000:]
        assert me.memory_info().rss - rss_before < 64 << 20, (rss_before, me.memory_info().rss)
        # The flooder goes: its connections close, and a client that disconnects is no error.
        flood.kill()
        flood.wait(10)
        wait_for(lambda: len(me.net_connections("unix")) < 8, 30, "the flood's connections gone")
        assert api(d.sock, "GET", "/v1/status", timeout=2.0)[0] == 200
        after = d.log.read_text()[len(text):]
        assert "ERROR" not in after and "Traceback" not in after, after
    finally:
        if flood is not None:
            flood.kill()
            flood.wait(10)
        d.stop()
    assert "descriptor limit raised from 1024" in d.log.read_text()


def _status_within(d: Berthd, limit_s: float) -> tuple[int, dict]:
    """``GET /v1/status`` answered within ``limit_s`` seconds, a connect that finds the
    socket's queue full (EAGAIN) tried again within that time, as a client does."""
    t0 = time.monotonic()
    while True:
        left = limit_s - (time.monotonic() - t0)
        assert left > 0, f"no answer within {limit_s} s"
        try:
            return api(d.sock, "GET", "/v1/status", timeout=left)
        except BlockingIOError:
            time.sleep(0.01)        # the kernel's accept queue: no event to wait on


def test_control_bounds_keep_room_for_root_and_count_per_uid():
    b = ControlBounds(total=10, per_uid=3, kept=4, operators=frozenset({0}))
    assert [b.admit(1000) for _ in range(4)] == [True, True, True, False]
    assert [b.admit(1001) for _ in range(4)] == [True, True, True, False]
    assert b.admit(1002) is False                   # others hold 6 = 10 - 4 kept
    assert all(b.admit(0) for _ in range(4)) and b.admit(0) is False    # 10 in all
    b.gone(1000)
    assert b.admit(0) is True and b.admit(1000) is False
    b.gone(0)
    b.gone(1001)
    assert b.admit(1002) is True
