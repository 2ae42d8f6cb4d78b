"""The holes of issue 18, each tried by a second Unix user the test creates (root runs berthd
and the victim's engines; CI runs as root, elsewhere these skip).

- hole 1: another user's ``berth run`` killed with SIGKILL takes its engine's group with it;
- hole 2: another user cannot attach to or report on a lease it does not own;
- hole 3: another user cannot take over the fallback state directory ``/tmp/berth-$UID``;
- hole 4: operator actions need an operator; a client's priority is capped by berth.toml;
- hole 5: another user's bad input (deep JSON, a report's ``ok`` not a bool) is a 4xx.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.berthd import berth_run, wait_for
from tests.faults.conftest import as_user, berth_cmd
from tests.security.users import ATTACKER, SYS_PY
from tests.security.users import attack as _attack


def _victim(d, runs, engine="victim"):
    runs.append(berth_run(d, engine, "--size", "4GiB"))
    wait_for(lambda: d.state_of(engine) == "active", 60, f"{engine} to be active")
    le = d.lease_of(engine)
    wait_for(lambda: d.lease_of(engine).get("pid"), 60, f"{engine}'s engine to attach")
    return le["id"]


def test_another_user_cannot_report_on_or_attach_to_a_lease(make_user, shared_berthd, runs):
    d = shared_berthd()
    lid = _victim(d, runs)
    mallory = make_user()
    status, body = _attack(mallory, d, "POST", f"/v1/leases/{lid}/report",
                           {"op": "drain", "ok": True})
    assert status == 403, body
    assert "does not own" in body["error"]["message"]
    status, body = _attack(mallory, d, "POST", f"/v1/leases/{lid}/attach", {"pid": "$PID"})
    assert status == 403, body
    # The attacker's process has exited: had its attach counted, the lease would now end.
    assert d.state_of("victim") == "active"
    assert d.lease_of("victim")["id"] == lid


def test_operator_actions_and_priority_need_the_operator(make_user, shared_berthd, runs):
    bob = make_user()
    d = shared_berthd(extra=f'[api]\nmax_priority = {{ {bob.pw_name} = 50 }}\n')
    _victim(d, runs)
    mallory = make_user()
    for op in ("drain", "park", "hold"):
        status, body = _attack(mallory, d, "POST", f"/v1/operator/{op}", {"target": "victim"})
        assert status == 403, (op, body)
        assert "not an operator" in body["error"]["message"]
    assert d.state_of("victim") == "active"
    lease = {"engine": "greedy", "shares": [{"size": "1GiB"}], "priority": 1000}
    status, body = _attack(mallory, d, "POST", "/v1/leases", lease)
    assert status == 403 and "priority" in body["error"]["message"], body
    status, body = _attack(bob, d, "POST", "/v1/leases", {**lease, "priority": 50})
    assert status == 201, body                 # what berth.toml allows bob
    status, body = _attack(bob, d, "POST", "/v1/leases", {**lease, "priority": 51})
    assert status == 403, body
    # root (berthd's own user) is the operator
    status, body = d.call("POST", "/v1/operator/hold", {"target": "victim"})
    assert status == 200, body


def test_operator_group_members_are_operators(make_user, shared_berthd, runs):
    import grp
    import subprocess
    carol = make_user()
    group = f"{carol.pw_name}ops"
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(["usermod", "-aG", group, carol.pw_name], check=True)
        d = shared_berthd(extra=f'[api]\noperator_group = "{group}"\n')
        _victim(d, runs)
        gid = grp.getgrnam(group).gr_gid
        out = as_user(carol, [SYS_PY, ATTACKER, str(d.sock), "POST", "/v1/operator/hold",
                              json.dumps({"target": "victim"})], timeout=30)
        assert out.stdout.startswith("403"), out.stdout     # without the group: refused
        out = subprocess.run([SYS_PY, ATTACKER, str(d.sock), "POST", "/v1/operator/hold",
                              json.dumps({"target": "victim"})], user=carol.pw_uid,
                             group=carol.pw_gid, extra_groups=[gid], capture_output=True,
                             text=True, timeout=30, cwd="/")
        assert out.stdout.startswith("200"), out.stdout + out.stderr
    finally:
        subprocess.run(["groupdel", group], check=False)


def _sim_cfg(where: Path) -> Path:
    cfg = where / "berth.toml"
    cfg.write_text('[driver]\nkind = "sim"\n[[driver.cards]]\npci = "0000:01:00.0"\n'
                   'name = "gpu0"\ntotal = "8GiB"\n')
    os.chmod(cfg, 0o644)
    return cfg


def _berth_as(user, *args, env=None, timeout=30):
    return as_user(user, [*berth_cmd(), *args], env={"XDG_RUNTIME_DIR": "", **(env or {})},
                   timeout=timeout)


def test_fallback_state_dir_cannot_be_taken_over(make_user, public_dir):
    victim, mallory = make_user(), make_user()
    fallback = Path(f"/tmp/berth-{victim.pw_uid}")
    precious = Path(f"/tmp/precious-{victim.pw_uid}")
    as_user(victim, ["sh", "-c", f"echo keep > {precious}"])
    try:
        # Mallory makes the victim's directory first, with a symlinked lock and her socket.
        as_user(mallory, ["sh", "-c", f"mkdir -m 777 {fallback} && "
                                      f"ln -s {precious} {fallback}/berthd.lock"])
        cfg = _sim_cfg(public_dir)
        out = _berth_as(victim, "daemon", "--config", str(cfg))
        assert out.returncode == 4, out.stdout + out.stderr
        assert f"owned by uid {mallory.pw_uid}" in out.stdout + out.stderr
        assert precious.read_text() == "keep\n"
        # A socket of Mallory's in a directory of hers: the victim's client will not talk to it.
        serve = ("import socket,os;s=socket.socket(socket.AF_UNIX);"
                 f"s.bind('{fallback}/berthd.sock');s.listen();os.chmod('{fallback}/berthd.sock',0o777);"
                 "print('up',flush=True);c,_=s.accept();c.recv(100);"
                 "c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\n{}')")
        import subprocess
        srv = subprocess.Popen([SYS_PY, "-c", serve], user=mallory.pw_uid,
                               group=mallory.pw_gid, extra_groups=[], stdout=subprocess.PIPE,
                               text=True, cwd="/")
        try:
            assert srv.stdout.readline().strip() == "up"
            out = _berth_as(victim, "status", "--json")
            assert out.returncode != 0, out.stdout
            assert "refusing berthd's socket" in out.stdout + out.stderr
        finally:
            srv.kill()
            srv.wait(5)
        # A directory of the victim's own but open to others is refused too.
        as_user(mallory, ["rm", "-rf", str(fallback)])
        as_user(victim, ["mkdir", "-m", "755", str(fallback)])
        out = _berth_as(victim, "daemon", "--config", str(cfg))
        assert out.returncode == 4 and "mode 0755" in out.stdout + out.stderr, out.stderr
    finally:
        precious.unlink(missing_ok=True)


def test_fallback_state_dir_is_made_private(make_user, public_dir):
    victim = make_user()
    fallback = Path(f"/tmp/berth-{victim.pw_uid}")
    cfg = _sim_cfg(public_dir)
    import subprocess
    p = subprocess.Popen([*berth_cmd(), "daemon", "--config", str(cfg)], user=victim.pw_uid,
                         group=victim.pw_gid, extra_groups=[], cwd="/",
                         env={"PATH": os.environ["PATH"], "HOME": "/tmp"},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (fallback / "berthd.sock").exists() or p.poll() is not None, 30,
                 "berthd to make its socket")
        assert p.poll() is None, p.stdout.read()
        st = fallback.stat()
        assert (st.st_mode & 0o777, st.st_uid) == (0o700, victim.pw_uid)
        out = _berth_as(victim, "status", "--json")
        assert out.returncode == 0, out.stderr
    finally:
        p.terminate()
        p.wait(15)


def _python_for(user_dir: Path) -> dict:
    """Env for the system Python, run as another user, to import this venv's Berth in every
    process it starts (``berth run``'s watchdog and engine too): a ``sitecustomize`` that adds
    the venv's site-packages, .pth files and all."""
    import sysconfig
    user_dir.mkdir(mode=0o755, exist_ok=True)
    (user_dir / "sitecustomize.py").write_text(
        f"import site\nsite.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    os.chmod(user_dir / "sitecustomize.py", 0o644)
    return {"PYTHONPATH": str(user_dir)}


def test_another_users_run_killed_takes_its_engine_group(make_user, shared_berthd, public_dir):
    """Hole 1 as another user: Mallory's ``berth run`` (its engine a grandchild behind a shell,
    under a parent that reaps nothing) is killed with SIGKILL; her engine's whole group dies
    with it and root's berthd ends the lease, so the card is free."""
    import shlex
    import subprocess

    from tests.faults.test_run_faults import REAPER, sigkill_run_and_check
    d = shared_berthd(cards=(("gpu0", "24GiB"),))
    for p in [d.tmp / "sim", *(d.tmp / "sim").rglob("*")]:   # her engine writes its use there
        os.chmod(p, 0o777 if p.is_dir() else 0o644)
    mallory = make_user()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
           "XDG_RUNTIME_DIR": "", "BERTH_SOCKET": str(d.sock),
           "BERTH_SIM_DIR": str(d.tmp / "sim"), **_python_for(public_dir / "py")}
    engine = shlex.join([SYS_PY, "-m", "berth.cli", "sim", "engine", "--port", "{port}",
                         "--weights", "4GiB", "--load-s", "0.1"]) + "; true"
    cmd = [SYS_PY, "-m", "berth.cli", "run", "--engine", "e", "--size", "6GiB", "--",
           "sh", "-c", engine]
    harness = subprocess.Popen([SYS_PY, REAPER, *cmd], env=env, user=mallory.pw_uid,
                               group=mallory.pw_gid, extra_groups=[], cwd="/",
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sigkill_run_and_check(d, harness, "her engine", uid=mallory.pw_uid)


def test_another_users_bad_input_gets_a_4xx_and_crashes_nothing(make_user, shared_berthd, runs):
    """Hole 5 as another user: deeply nested JSON and a report whose ``ok`` is not a JSON bool
    (on a lease of her own; the body is refused before the lease is looked up) get a 4xx naming
    the problem (no 500, no traceback); root's lease and berthd carry on."""
    d = shared_berthd()
    _victim(d, runs)
    mallory = make_user()
    deep = '{"engine": ' + "[" * 50_000 + "]" * 50_000 + "}"   # one argv string < 128 KiB
    out = as_user(mallory, [SYS_PY, ATTACKER, str(d.sock), "POST", "/v1/leases", deep])
    status, _, text = out.stdout.strip().partition(" ")
    assert 400 <= int(status) < 500, out.stdout[:500] + out.stderr[-500:]
    assert "Traceback" not in text and json.loads(text)["error"]["type"] != "internal", text
    status, body = _attack(mallory, d, "POST", "/v1/leases",
                           {"engine": "mine", "shares": [{"size": "1GiB"}]})
    assert status == 201, body
    mine = body["id"]
    for ok in ("yes", 1, None):
        status, body = _attack(mallory, d, "POST", f"/v1/leases/{mine}/report",
                               {"op": "drain", "ok": ok})
        assert status == 400 and "ok" in body["error"]["message"], (ok, body)
    assert d.state_of("victim") == "active"
    assert d.call("GET", "/v1/health")[0] == 200
