"""An engine's child that left its run's process tree and still holds memory (an escapee,
issue 36) is named with its lease on the web board and in ``berth status``, as the status JSON
names it: before, only the JSON had it. A real berthd on a simulated card, real processes, the
board in Debian's headless ``chromium`` (Playwright)."""

from __future__ import annotations

import os
import re
import subprocess

import psutil

from tests.berthd import BERTH, Berthd, api, sim_config, wait_for
from tests.board.test_board import ARGS, CHROMIUM, _port
from tests.helpers import playwright, stop_all

GiB = 1 << 30


def test_an_escapee_is_named_with_its_lease_on_the_board_and_in_status(tmp_path):
    port = _port()
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")],
                     extra=f'[board]\nlisten = "127.0.0.1:{port}"\n')
    d = Berthd(tmp_path, cfg).start()
    # L (the lease's process) -> M (a shell) -> C (the engine, 3 GiB on gpu0).
    engine = f"{BERTH} sim engine --port {_port()} --weights 3GiB --card gpu0"
    holder = subprocess.Popen(["bash", "-c", f"bash -c '{engine} & wait' & exec sleep 600"],
                              env=d.env, start_new_session=True)
    procs = [holder, d.proc]
    try:
        start = psutil.Process(holder.pid).create_time()
        code, out = api(d.sock, "POST", "/v1/leases", {
            "engine": "esc", "owner_pid": os.getpid(), "pid": holder.pid, "start_time": start,
            "shares": [{"card": "gpu0", "size": "4GiB"}]})
        assert code == 201, out
        wait_for(lambda: (d.lease_of("esc")["shares"][0]["used_bytes"] or 0) >= 3 * GiB, 30,
                 "the engine's memory counted for the lease")
        shell = next(c for c in psutil.Process(holder.pid).children() if c.name() == "bash")
        engine_pid = next(c.pid for c in shell.children())
        shell.kill()                    # the engine leaves L's tree: it is an escapee now
        got = wait_for(lambda: d.lease_of("esc").get("escapees"), 30, "the escapee named")
        assert [(e["pid"], e["card_name"]) for e in got] == [(engine_pid, "gpu0")], got
        assert got[0]["bytes"] >= 3 * GiB
        text = subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                              timeout=30, check=True).stdout
        line = next((x for x in text.splitlines() if x.startswith("! esc (")), "")
        assert re.search(rf"pid {engine_pid} \(3\.\dGiB on gpu0\)", line), text
        assert "left its run's process tree" in line and "stop them" in line, text
        with playwright.sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = b.new_page()
                page.goto(f"http://127.0.0.1:{port}/")
                page.wait_for_selector("#conn.up")
                page.wait_for_function("""() => [...document.querySelectorAll(
                    '#cards .card-notes')].some(n => n.textContent.includes('escapees of esc'))""",
                                       timeout=20000)
                notes = page.text_content("#cards .card[data-card='gpu0'] .card-notes")
            finally:
                b.close()
        assert re.search(rf"escapees of esc: pid {engine_pid} 3\.\d GiB \(left its run's tree",
                         notes), notes
    finally:
        stop_all(procs, tmp_path)
