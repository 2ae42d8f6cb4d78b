"""berthd as a real process on simulated cards, driven over its socket (issue 4 acceptance)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.berthd import BERTH, Berthd, GiB, berth_run, stop_proc
from tests.helpers import wait_for


def lease(d: Berthd, engine: str, size: str, card: str | None = None, **extra) -> str:
    code, r = d.call("POST", "/v1/leases", {"engine": engine,
                                            "shares": [{"card": card, "size": size}], **extra})
    assert code == 201, r
    return r["id"]


class TestGrants:
    def test_two_fit_a_third_waits_and_is_granted_once_the_driver_confirms(self, berthd, runs):
        d = berthd()
        runs.append(berth_run(d, "A", "--size", "10GiB", weights="9GiB"))
        runs.append(berth_run(d, "B", "--size", "10GiB", weights="9GiB"))
        wait_for(lambda: d.state_of("A") == "active" and d.state_of("B") == "active",
                 what="A and B granted")
        runs.append(berth_run(d, "C", "--size", "10GiB", "--priority", "-1", weights="9GiB"))
        wait_for(lambda: d.state_of("C") == "waiting", what="C waiting")
        wait_for(lambda: (d.lease_of("A")["shares"][0]["used_bytes"] or 0) >= 9 * GiB, what="A loaded")
        stop_proc(runs[0])
        wait_for(lambda: d.state_of("C") == "active", what="C granted")
        tl = d.timeline()
        freed = next(e for e in tl if e["kind"] == "freed" and e["engine"] == "A")
        granted = next(e for e in tl if e["kind"] == "grant" and e["engine"] == "C")
        assert granted["seq"] > freed["seq"]          # after the driver read, not before
        assert d.sim_oom() == 0

    def test_a_lease_that_would_spend_the_reserve_waits(self, berthd):
        d = berthd(reserve="4GiB")
        a = lease(d, "A", "12GiB", priority=5)
        b = lease(d, "B", "10GiB")                  # 12 + 10 > 24 - 4
        assert d.state_of("A") == "active" and d.state_of("B") == "waiting"
        card = d.status()["cards"][0]
        assert card["reserve_bytes"] == 4 * GiB and card["budget_bytes"] == 8 * GiB
        assert a and b

    def test_never_fits_is_refused_with_the_reason(self, berthd):
        d = berthd()
        code, r = d.call("POST", "/v1/leases", {"engine": "huge",
                                                "shares": [{"card": "gpu0", "size": "30GiB"}]})
        assert code == 409 and "capacity" in r["error"]["message"]


class TestTwoCards:
    def test_a_two_card_run_leases_both_cards_or_waits_for_both(self, berthd, runs):
        d = berthd(cards=(("gpu0", "24GiB"), ("gpu1", "24GiB")))
        blocker = lease(d, "blocker", "20GiB", card="gpu1", priority=9)
        runs.append(berth_run(d, "TP2", "--size", "10GiB@gpu0", "--size", "10GiB@gpu1",
                              weights="1GiB"))
        wait_for(lambda: d.state_of("TP2") == "waiting/waiting", what="TP2 waits for both")
        card0 = d.status()["cards"][0]
        assert card0["counted_bytes"] == 0            # nothing taken on gpu0 meanwhile
        d.call("POST", f"/v1/leases/{blocker}/release", {})
        wait_for(lambda: d.state_of("TP2") == "active/active", what="TP2 on both cards")
        env = open(f"/proc/{_engine_pid(d, 'TP2')}/environ", "rb").read().split(b"\0")
        cvd = next(x for x in env if x.startswith(b"CUDA_VISIBLE_DEVICES=")).decode()
        assert cvd.count("GPU-") == 2 and b"CUDA_DEVICE_ORDER=PCI_BUS_ID" in env

    def test_the_cards_of_a_mixed_box_schedule_apart(self, berthd):
        d = berthd(cards=(("big", "24GiB"), ("small", "12GiB")), policy={"queue": "strict"})
        lease(d, "holder", "10GiB", card="small", priority=9)
        lease(d, "w-small", "8GiB", card="small")     # must wait: small is full
        lease(d, "w-big", "8GiB", card="big")         # strict, yet not blocked by small's head
        assert d.state_of("w-small") == "waiting"
        assert d.state_of("w-big") == "active"


def _engine_pid(d: Berthd, engine: str) -> int:
    return wait_for(lambda: (d.lease_of(engine) or {}).get("pid"), what=f"{engine} attached")


class TestRestart:
    def test_kill9_and_restart_reattaches_live_leases_and_drops_dead_ones(self, berthd, runs, tmp_path):
        d = berthd(policy={"ram_budget": "64GiB"})
        ck = ("--park", "checkpoint", "--checkpoint-path", str(BERTH) + "-sim-cuda-checkpoint")
        runs.append(berth_run(d, "A", "--front", f"127.0.0.1:{_port()}", "--size", "10GiB", *ck,
                              weights="9GiB"))
        wait_for(lambda: d.state_of("A") == "active", what="A active")
        wait_for(lambda: (d.lease_of("A")["shares"][0]["used_bytes"] or 0) > 0, what="A loaded")
        runs.append(berth_run(d, "B", "--size", "10GiB", weights="9GiB"))
        wait_for(lambda: d.state_of("B") == "active", what="B active")
        code, _ = d.call("POST", "/v1/operator/park", {"target": "A"})
        assert code == 200
        wait_for(lambda: d.state_of("A") == "parked", what="A parked")
        runs.append(berth_run(d, "C", "--size", "20GiB", "--priority", "-5", weights="1GiB"))
        wait_for(lambda: d.state_of("C") == "waiting", what="C waiting")
        doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        lease(d, "D", "1GiB", owner_pid=doomed.pid, priority=-9)
        before = {le["engine"]: le for le in d.status()["leases"]}
        d.kill9()
        doomed.kill()
        doomed.wait()
        d.start()
        after = {le["engine"]: le for le in d.status()["leases"]}
        assert set(after) == {"A", "B", "C"}, after.keys()
        for e in ("A", "B", "C"):
            assert [s["state"] for s in after[e]["shares"]] == \
                   [s["state"] for s in before[e]["shares"]], e
            assert after[e]["id"] == before[e]["id"] and after[e]["pid"] == before[e]["pid"]
        assert "re-attached" in "".join(e["text"] for e in d.timeline())
        # The runs keep working with the new berthd: a wake of A goes through it.
        code, _ = d.call("POST", "/v1/operator/wake", {"target": "A"})
        assert code == 200
        wait_for(lambda: d.state_of("A") == "active", what="A woke after the restart")
        assert d.sim_oom() == 0

    def test_a_truncated_state_file_starts_empty_with_a_clear_message(self, berthd, tmp_path):
        d = berthd()
        lease(d, "A", "1GiB", owner_pid=os.getpid())
        d.stop()
        state = tmp_path / "state" / "state.toml"
        data = state.read_bytes()
        # Cut inside the lease's engine name: an unterminated string, so never a shorter file
        # that still parses (half the file had cut at a line's end once the file grew).
        state.write_bytes(data[: data.index(b'engine = "A"') + len(b'engine = "A')])
        d.start()
        assert d.status()["leases"] == []
        log = d.log.read_text()
        assert "cannot read the state file" in log and "Moved it aside" in log
        assert list((tmp_path / "state").glob("state.toml.corrupt-*"))


class TestSafety:
    def test_attach_of_a_pid_the_caller_neither_is_nor_parents_is_refused(self, berthd):
        d = berthd()
        lid = lease(d, "A", "1GiB")
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                    start_new_session=True)
        try:
            # The test process is the stranger's parent, so ask from a grandchild instead.
            code = subprocess.run(
                [sys.executable, "-c",
                 "import sys; sys.path.insert(0, %r); from tests.berthd import api; "
                 "c, r = api(%r, 'POST', '/v1/leases/%s/attach', {'pid': %d}); "
                 "print(c, r); sys.exit(0 if c == 403 else 1)"
                 % (os.getcwd(), str(d.sock), lid, stranger.pid)],
                capture_output=True, text=True)
            assert code.returncode == 0, code.stdout + code.stderr
            assert "neither" in code.stdout
            assert d.lease_of("A")["pid"] is None
            assert "refused" in d.log.read_text()
        finally:
            stranger.kill()
            stranger.wait()

    def test_attach_by_the_parent_is_allowed(self, berthd):
        d = berthd()
        lid = lease(d, "A", "1GiB")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            code, r = d.call("POST", f"/v1/leases/{lid}/attach", {"pid": child.pid})
            assert code == 200 and r["why"] == "the caller is its parent"
        finally:
            child.kill()
            child.wait()

    def test_a_reused_pid_is_never_signalled(self):
        from berth.process import ProcessId, SignalRefused, identify, signal_group, signal_process
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
        try:
            real = identify(p.pid)
            fake = ProcessId(p.pid, real.start_time - 100.0)   # "recorded" for another process
            with pytest.raises(SignalRefused):
                signal_process(fake, signal.SIGTERM)
            with pytest.raises(SignalRefused):
                signal_group(fake, signal.SIGKILL)
            assert p.poll() is None                            # untouched
            signal_process(real, signal.SIGTERM)
            assert p.wait(5) == -signal.SIGTERM
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


class TestSurface:
    def test_status_json_has_the_design_keys(self, berthd):
        d = berthd()
        lease(d, "A", "2GiB", owner_pid=os.getpid())
        st = d.status()
        for k in ("pci", "name", "total_bytes", "reserve_bytes", "baseline_bytes",
                  "stowaway_bytes", "claim_bytes", "free_bytes", "budget_bytes"):
            assert k in st["cards"][0]
        for k in ("id", "engine", "pid", "start_time", "priority", "capabilities", "shares"):
            assert k in st["leases"][0]
        for k in ("card", "size_bytes", "state", "lent_bytes", "residual_bytes"):
            assert k in st["leases"][0]["shares"][0]
        for k in ("admissions_rejected_with_free", "parks", "lends", "drains",
                  "fallbacks_to_drain", "wakes", "unparked", "reserve_fraction"):
            assert k in st["counters"]
        # The adapters berthd loaded, from the registry (issue 38).
        assert st["adapters"] == ["llamacpp", "ollama", "protocol", "sglang", "vllm"]
        out = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True)
        assert out.returncode == 0 and "gpu0" in out.stdout and "A" in out.stdout
        assert "adapters: llamacpp, ollama, protocol, sglang, vllm" in out.stdout, out.stdout
        # The counter of waits with some memory free says what it counts: main's "refused while
        # memory was free" alarmed a new user (it counts every wait where free memory was short)
        assert "waited with some memory free, not enough 0" in out.stdout, out.stdout
        assert "refused" not in out.stdout, out.stdout

    def test_metrics_are_prometheus_text(self, berthd):
        d = berthd()
        conn_code, _ = d.call("GET", "/v1/status")
        from tests.berthd import UnixHTTPConnection
        c = UnixHTTPConnection(str(d.sock))
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        from prometheus_client.parser import text_string_to_metric_families
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        total = fams["berth_card_total_bytes"].samples[0]
        assert total.labels == {"card": "gpu0", "pci": "0000:01:00.0"} and total.value == 24 * GiB
        assert fams["berth_reserve_fraction"].samples[0].value == pytest.approx(1 / 24, abs=1e-3)
        assert "berth_drains" in fams
        said = fams["berth_admissions_rejected_with_free"].documentation
        assert "waited with some memory free" in said and "not enough" in said, said

    def test_operator_commands_act_through_the_api(self, berthd):
        d = berthd()
        lease(d, "A", "2GiB", owner_pid=os.getpid())
        out = subprocess.run([BERTH, "hold", "A"], env=d.env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert d.lease_of("A")["held"] is True
        out = subprocess.run([BERTH, "park", "A"], env=d.env, capture_output=True, text=True)
        assert out.returncode == 1 and "front" in out.stderr      # refused: no front (rule 3)
        out = subprocess.run([BERTH, "drain", "nosuch"], env=d.env, capture_output=True, text=True)
        assert out.returncode == 1 and "nosuch" in out.stderr

    def test_berth_status_without_berthd_says_how_to_start_it(self, tmp_path):
        env = {**os.environ, "BERTH_SOCKET": str(tmp_path / "none.sock")}
        out = subprocess.run([BERTH, "status"], env=env, capture_output=True, text=True)
        assert out.returncode == 3 and "berth daemon" in out.stderr

    def test_a_bad_config_stops_the_daemon_listing_every_error(self, tmp_path):
        cfg = tmp_path / "bad.toml"
        cfg.write_text('[driver]\nkind = "sim"\n[[driver.cards]]\npci = "x"\nname = "g"\n'
                       'total = "lots"\n[policy]\nqueue = "fifo"\n')
        out = subprocess.run([BERTH, "daemon", "--config", str(cfg)], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 2
        for key in ("driver.cards.0.pci", "driver.cards.0.total", "policy.queue"):
            assert key in out.stderr
        chk = subprocess.run([BERTH, "config", "check", str(cfg)], capture_output=True, text=True)
        assert chk.returncode == 2 and "policy.queue" in chk.stderr


def _port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
