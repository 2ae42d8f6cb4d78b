"""Device check: berthd on a real NVIDIA card, two engines that cannot both fit, a real park.

``python -m tests.device.check_live --out DIR [--checkpoint PATH]`` (from the repository root,
where ``berth`` and ``berthd`` are beside this Python and torch is importable):

1. reads the card with the most free memory through :class:`berth.driver.nvml.NvmlDriver`;
2. starts berthd on the NVML driver (defaults, except a claim that leaves about 26 GiB of the
   card to leases, so that the check moves 14 GiB rather than half an H200);
3. starts engine A (``berth run --size 16GiB --park checkpoint``, ``torch_engine.py`` holding
   14 GiB) and asks its front; then engine B, the same size, and asks B's front: berthd must make
   room by parking A (cuda-checkpoint to host RAM);
4. asks A's front again: berthd parks B and wakes A, and A's memory must hold the same bytes;
5. starts a process that holds 2 GiB outside any lease: the board must name it a stowaway;
6. writes ``DIR/live.json`` (the figures: seconds to each answer, NVML's reads, the states) and
   copies berthd's and each run's log into ``DIR``.

Every wait has a ceiling; a step that fails is named in ``live.json`` with its error, and the
later steps are skipped. Not collected by pytest (the name does not match ``test_*.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from berth.driver.nvml import NvmlDriver

from tests.berthd import BERTH, api

GiB = 1 << 30
HERE = Path(__file__).resolve().parent
LEASABLE = 26 * GiB
SIZE, HOLD = "16GiB", 14


def _post(port: int, timeout: float) -> tuple[float, dict]:
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=b'{"model": "x", "messages": []}',
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = json.loads(r.read())
    return round(time.monotonic() - t0, 2), body


def _states(sock: Path) -> dict:
    code, st = api(sock, "GET", "/v1/status", timeout=10)
    return {le["engine"]: "/".join(sh["state"] for sh in le["shares"]) for le in st["leases"]}


def _card(driver: NvmlDriver, pci: str) -> dict:
    r = driver.read(pci)
    return {"free_gib": round(r.free_bytes / GiB, 2), "processes_known": r.processes_known,
            "processes_gib": {str(p): round(b / GiB, 2) for p, b in r.processes.items()}}


def _until(check, ceiling_s: float, what: str, show=lambda: None):
    """Poll ``check`` until it returns something truthy; past ``ceiling_s``, raise naming
    ``what`` and ``show()`` (the state that was seen)."""
    end = time.monotonic() + ceiling_s
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {ceiling_s:g} s; seen {show()}")


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def _healthy(sock: Path) -> bool:
    try:
        return sock.exists() and api(sock, "GET", "/v1/health", timeout=5)[0] == 200
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", default=shutil.which("cuda-checkpoint") or "cuda-checkpoint")
    a = ap.parse_args()
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/berth-live")
    shutil.rmtree(work, ignore_errors=True)
    (work / "state").mkdir(parents=True)
    report: dict = {"steps": []}
    procs: list[subprocess.Popen] = []

    driver = NvmlDriver()
    card = max(driver.cards(), key=lambda c: c.free_bytes)
    report["card"] = {"pci": card.pci, "model": card.model, "uuid": card.uuid,
                      "total_gib": round(card.total_bytes / GiB, 2),
                      "free_gib": round(card.free_bytes / GiB, 2)}
    claim = card.free_bytes - LEASABLE
    cfg = work / "berth.toml"
    cfg.write_text(f'state_dir = "{work / "state"}"\n[board]\nlisten = "off"\n'
                   f'[cards."{card.pci}"]\nclaims = {{ device-check = "{claim}B" }}\n')
    sock = work / "state" / "berthd.sock"
    env = {**os.environ, "BERTH_STATE_DIR": str(work / "state"), "BERTH_SOCKET": str(sock),
           "BERTH_CONFIG": str(cfg), "PYTHONUNBUFFERED": "1"}
    engine = [sys.executable, str(HERE / "torch_engine.py"), "--port", "{port}",
              "--gib", str(HOLD)]

    def step(name: str, fn) -> bool:
        t0 = time.monotonic()
        try:
            got = fn()
            report["steps"].append({"step": name, "ok": True, "s": round(time.monotonic() - t0, 2),
                                    **(got or {})})
            return True
        except Exception as e:  # noqa: BLE001 — the report names any failure and stops there
            report["steps"].append({"step": name, "ok": False,
                                    "s": round(time.monotonic() - t0, 2),
                                    "error": f"{type(e).__name__}: {e}"})
            return False

    def start_berthd():
        procs.append(subprocess.Popen([BERTH, "daemon", "--config", str(cfg)], env=env,
                                      stdout=open(work / "berthd.log", "ab"),
                                      stderr=subprocess.STDOUT))
        _until(lambda: _healthy(sock), 60, "berthd answering",
               lambda: (work / "berthd.log").read_text()[-2000:])
        st = api(sock, "GET", "/v1/status", timeout=10)[1]
        c = next(c for c in st["cards"] if c["pci"] == card.pci)
        return {"driver": st["driver"], "budget_gib": round(c["budget_bytes"] / GiB, 2),
                "baseline_gib": round(c["baseline_bytes"] / GiB, 2),
                "reserve_gib": round(c["reserve_bytes"] / GiB, 2),
                "status_text": subprocess.run([BERTH, "status"], env=env, capture_output=True,
                                              text=True, timeout=30).stdout}

    def run(name: str, port: int):
        cmd = [BERTH, "run", "--engine", name, "--front", f"127.0.0.1:{port}", "--size", SIZE,
               "--park", "checkpoint", "--checkpoint-path", a.checkpoint, "--", *engine]
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(work / f"run-{name}.log", "ab"),
                                      stderr=subprocess.STDOUT, start_new_session=True))

    def ask(name: str, port: int, then: str):
        _until(lambda: _listens(port), 60, f"{name}'s front listening",
               lambda: (work / f"run-{name}.log").read_text()[-2000:])
        s, body = _post(port, timeout=240)
        got = {f"{name}_answer_s": s, f"{name}_same_bytes": body["same"],
               f"{name}_pid": body["pid"], "states": _states(sock), "card": _card(driver, card.pci)}
        assert body["same"], body
        if then:
            got["states"] = _until(lambda: (st := _states(sock)).get(then) == "parked" and st,
                                   60, f"{then} parked", lambda: _states(sock))
            got["card_after_park"] = _card(driver, card.pci)
        return got

    def stowaway():
        code = ("import sys, torch; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); "
                "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()")
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": card.uuid})
        procs.append(p)
        try:
            assert p.stdout.readline().strip() == "ready", "the stowaway did not allocate"

            def named():
                st = api(sock, "GET", "/v1/status", timeout=10)[1]
                c = next(c for c in st["cards"] if c["pci"] == card.pci)
                return next((s for s in c["stowaways"] if s["pid"] == p.pid), None)
            seen = _until(named, 30, "the stowaway named on the board",
                          lambda: api(sock, "GET", "/v1/status", timeout=10)[1]["cards"])
            text = subprocess.run([BERTH, "status"], env=env, capture_output=True, text=True,
                                  timeout=30).stdout
            return {"stowaway": seen, "status_text": text}
        finally:
            p.kill()
            p.wait(30)

    ok = step("berthd on NVML", start_berthd)
    if ok:
        run("A", 18101)
        ok = step("A cold start and first answer", lambda: ask("A", 18101, ""))
    if ok:
        run("B", 18102)
        ok = step("B's answer, making room by parking A", lambda: ask("B", 18102, "A"))
    if ok:
        ok = step("A's answer: wake A, park B, the same bytes", lambda: ask("A", 18101, "B"))
    if ok:
        ok = step("a stowaway: memory held outside any lease is named", lambda: stowaway())
    if ok:
        step("timeline", lambda: {"timeline": api(sock, "GET", "/v1/timeline", timeout=10)[1]
                                  .get("entries", [])[-40:]})
    for p in reversed(procs):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM) if p is not procs[0] else p.terminate()
                p.wait(30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                p.kill()
    report["card_at_end"] = _card(driver, card.pci)
    for log in work.glob("*.log"):
        shutil.copy(log, out / log.name)
    (out / "live.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "steps"}, indent=2))
    for s in report["steps"]:
        print(s["step"], "ok" if s["ok"] else f"FAILED {s.get('error')}", s["s"], "s")
    return 0 if all(s["ok"] for s in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
