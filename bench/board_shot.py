"""A screenshot of the web board during ``berth demo`` (README's docs/board.png).

Runs ``berth demo`` (its berthd serves the board on the default ``[board] listen``,
127.0.0.1:7088), waits until one engine is parked in host RAM while the other serves, and saves
the page as drawn by Debian's headless chromium through Playwright.

    .venv/bin/python bench/board_shot.py [--out docs/board.png] [--url http://127.0.0.1:7088/]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _state(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "state", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/board.png")
    ap.add_argument("--url", default="http://127.0.0.1:7088/")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    if _state(a.url) is not None:
        print(f"something already serves {a.url}: stop it first", file=sys.stderr)
        return 2
    demo = subprocess.Popen([str(Path(sys.executable).parent / "berth"), "demo"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=a.chromium, args=ARGS, headless=True)
            page = b.new_page(viewport={"width": 1400, "height": 900})
            end = time.monotonic() + 60
            while _state(a.url) is None:
                if demo.poll() is not None or time.monotonic() > end:
                    print("the demo's board never answered", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            page.goto(a.url)
            page.wait_for_selector("#conn.up")
            # The page follows the demo live; shoot once one engine is parked while another
            # serves, after at least two parks (so the events and the chart have something).
            page.wait_for_function("""() => {
                const s = [...document.querySelectorAll('#cards .seg.share')].map(x => x.dataset.state);
                const parks = document.querySelectorAll('#events li[data-kind="parked"]').length;
                return s.includes('parked') && s.includes('active') && parks >= 2; }""",
                                   timeout=120_000)
            page.screenshot(path=a.out, full_page=True)
            b.close()
        print(f"wrote {a.out}")
        return 0
    finally:
        demo.wait(180)


if __name__ == "__main__":
    sys.exit(main())
