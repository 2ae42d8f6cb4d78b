"""The web board in a real headless Chromium (issue 15 acceptance), against a real berthd on
simulated cards with real ``berth run`` engines.

The browser is Debian's ``chromium`` driven by Playwright (``.ci/run`` installs both). These
tests never skip: without the browser they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.berthd import BERTH, Berthd, api, berth_run, sim_config, wait_for
from tests.helpers import playwright, stop_all

# One worker runs the module in order: its tests share one berthd and one browser, and a later
# test reads what an earlier one did (alpha's switch costs).
pytestmark = pytest.mark.xdist_group("board")

CHROMIUM = os.environ.get("BERTH_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
KEY = "board-key-for-tests-0123456789"
XSS = "<img src=x onerror=alert(1)>"           # as the issue spells it: a claim's name
XSS_ENGINE = "<img/src=x/onerror=alert(2)>"     # engine names have no spaces: the same attack
CKPT = str(BERTH) + "-sim-cuda-checkpoint"
OUT = Path(__file__).resolve().parents[2] / "bench" / "out"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    def __init__(self, tmp: Path):
        self.port = _port()
        cfg = sim_config(tmp, [("gpu0", "24GiB"), ("gpu1", "16GiB")],
                         policy={"ram_budget": "64GiB"},
                         extra=f'[board]\nlisten = "127.0.0.1:{self.port}"\nkey = "{KEY}"\n')
        text = cfg.read_text().replace("[cards.gpu1]\n", "[cards.gpu1]\nclaims = { "
                                       + json.dumps(XSS) + ' = "1GiB" }\n')
        cfg.write_text(text)
        self.d = Berthd(tmp, cfg)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.runs = []

    def http(self, method: str, path: str, body=None, headers=None) -> tuple[int, dict, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("board"))
    w.d.start()
    d = w.d
    w.runs.append(berth_run(d, "alpha", "--size", "8GiB@gpu0", "--park", "checkpoint",
                            "--front", f"127.0.0.1:{_port()}", "--checkpoint-path", CKPT,
                            weights="6GiB"))
    w.runs.append(berth_run(d, "beta", "--size", "6GiB@gpu1", weights="4GiB"))
    wait_for(lambda: d.state_of("alpha") == "active" and d.state_of("beta") == "active",
             what="alpha and beta active")
    wait_for(lambda: (d.lease_of("alpha")["shares"][0]["used_bytes"] or 0) > 0, what="alpha loaded")
    # A waiter that cannot be placed: it asks for more than gpu1 can give beside beta.
    code, out = api(d.sock, "POST", "/v1/leases", {
        "engine": "gamma", "owner_pid": os.getpid(), "priority": -5,
        "shares": [{"card": "gpu1", "size": "12GiB"}]})
    assert code == 201, out
    code, out = api(d.sock, "POST", "/v1/leases", {
        "engine": XSS_ENGINE, "owner_pid": os.getpid(),
        "shares": [{"card": "gpu0", "size": "1GiB"}]})
    assert code == 201, out
    yield w
    stop_all([*w.runs, d.proc], w.d.tmp)


@pytest.fixture(scope="module")
def browser():
    # No skip: a machine without the browser fails here (issue 15: "the test never skips").
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _page(browser, world):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(world.url)
    page.wait_for_selector("#conn.up")
    page.wait_for_selector("#cards .card .seg.share")
    return page


def _state(page, engine: str) -> str | None:
    return page.evaluate("""e => { for (const s of document.querySelectorAll('#cards .seg.share'))
        if (s.dataset.engine === e) return s.dataset.state; return null; }""", engine)


def test_bars_names_live_park_waiter_and_screenshot(world, browser, tmp_path):
    page = _page(browser, world)
    try:
        cards = page.eval_on_selector_all("#cards .card", "cs => cs.map(c => c.dataset.card)")
        assert cards == ["gpu0", "gpu1"]
        names = page.eval_on_selector_all("#cards .seg.share",
                                          "ss => ss.map(s => s.dataset.engine)")
        assert {"alpha", "beta"} <= set(names), names
        assert _state(page, "alpha") == "active"
        page.evaluate("window.__sameDocument = 42")
        code, out = world.d.call("POST", "/v1/operator/park", {"target": "alpha"})
        assert code == 200, out
        page.wait_for_function("""() => [...document.querySelectorAll('#cards .seg.share')]
            .some(s => s.dataset.engine === 'alpha' && s.dataset.state === 'parked')""",
                               timeout=20000)
        assert page.evaluate("window.__sameDocument") == 42       # no reload happened
        ram = page.eval_on_selector_all("#ram .seg", "ss => ss.map(s => s.dataset.engine)")
        assert "alpha" in ram                       # parked: shown against the host-RAM budget
        assert f"operator park alpha by pid {os.getpid()}" in world.d.log.read_text()
        why = page.text_content("#waiting li[data-engine='gamma']")
        reason = world.d.status()["waiting"][0]["why"]
        assert reason and reason in why, (reason, why)
        assert page.locator("#charts svg").count() >= 3
        assert page.locator("#events li[data-kind='parked']").count() >= 1
        # berthd's registry of adapters (issue 38)
        assert "adapters: llamacpp, ollama, protocol, sglang, vllm" in page.text_content("#meta")
        shot = tmp_path / "board.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, OUT / "board.png")
    finally:
        page.context.close()


def test_no_key_means_403_and_no_buttons(world, browser):
    code, _, out = world.http("POST", "operator/park", {"target": "beta"},
                              headers={"X-Berth-Board": "1"})
    assert code == 403, out
    code, _, out = world.http("POST", "operator/park", {"target": "beta"},
                              headers={"Authorization": "Bearer wrong-key-wrong-key"})
    assert code == 403, out
    code, _, out = world.http("POST", "login", {"name": "mallory", "key": "not the key at all"})
    assert code == 403, out
    page = _page(browser, world)
    try:
        assert page.locator("button.op").count() == 0
        assert page.text_content("#who") == "read-only"
    finally:
        page.context.close()
    assert world.d.state_of("beta") == "active"


def test_with_the_key_a_park_from_the_page_parks(world, browser):
    d = world.d
    if d.state_of("alpha") != "active":
        assert d.call("POST", "/v1/operator/wake", {"target": "alpha"})[0] == 200
        wait_for(lambda: d.state_of("alpha") == "active", what="alpha awake again")
    page = _page(browser, world)
    try:
        page.fill("#login-name", "ada")
        page.fill("#login-key", KEY)
        page.click("#login button[type=submit]")
        page.wait_for_selector("#who:text('operator: ada')")
        page.wait_for_function("""() => [...document.querySelectorAll('#cards .seg.share')]
            .some(s => s.dataset.engine === 'alpha' && s.dataset.state === 'active')""",
                               timeout=20000)
        page.click("tr[data-engine='alpha'] button[data-op='park']")
        wait_for(lambda: d.state_of("alpha") == "parked", what="alpha parked from the page")
        page.wait_for_selector("#events li[data-kind='operator']")
        assert "by ada" in page.text_content("#events li[data-kind='operator']")
        log = d.log.read_text()
        assert "board: operator ada from 127.0.0.1: park alpha" in log
    finally:
        page.context.close()


def test_csp_is_strict_and_names_are_text(world, browser):
    for path in ("", "static/page.js", "static/page.css", "state"):
        _, headers, _ = _get_raw(world.url + path)
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, csp
    _, headers, _ = world.http("POST", "operator/park", {"target": "beta"})
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert api(world.d.sock, "POST", "/v1/leases", {
        "engine": XSS, "shares": [{"card": "gpu0", "size": "1GiB"}]})[0] == 400
    page = _page(browser, world)
    try:
        page.wait_for_function("""n => [...document.querySelectorAll('#cards .seg')]
            .some(s => s.textContent.includes(n))""", arg=XSS_ENGINE)
        page.wait_for_function("""n => [...document.querySelectorAll('#cards .seg.claim')]
            .some(s => s.textContent.includes(n))""", arg=XSS)
        assert page.locator("img").count() == 0
        page.evaluate("() => new Promise(r => setTimeout(r, 300))")   # give a handler its turn
        assert page.dialogs == []
    finally:
        page.context.close()


def _get_raw(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        r.read()
        return r.status, dict(r.headers), None


def test_metrics_have_the_wait_time_histogram(world):
    code, out = world.d.call("GET", "/metrics")
    text = out["raw"]
    assert code == 200
    grants = [ln for ln in text.splitlines()
              if ln.startswith('berth_wait_seconds_count{kind="grant"}')]
    assert grants and float(grants[0].split()[-1]) >= 3, grants   # alpha, beta and the name test
    assert 'berth_wait_seconds_bucket{kind="grant",le="+Inf"}' in text
    costs = world.d.status().get("switch_costs") or {}
    # alpha was parked and woken by the tests before (module order): its costs are measured.
    assert costs.get("alpha", {}).get("park_s") is not None, costs
    assert 'berth_switch_seconds{engine="alpha",switch="park"}' in text
    assert 'berth_switch_seconds{engine="alpha",switch="cold_start"}' in text
    # The Grafana dashboard uses only metrics /metrics gives, with labels they carry.
    dash = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-berth.json")
                      .read_text())
    used = _dashboard_uses(dash)
    exposed = _exposed(text)
    assert used and set(used) <= set(exposed), sorted(set(used) - set(exposed))
    wrong = {m: sorted(labels - exposed[m]) for m, labels in used.items() if labels - exposed[m]}
    assert not wrong, f"labels the metrics do not carry: {wrong}"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_SELECTOR = re.compile(r"\b(berth_[a-zA-Z0-9_]+)\s*(?:\{([^}]*)\})?")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _exposed(text: str) -> dict[str, set[str]]:
    """A Prometheus text scrape -> metric sample name -> the label names it carries."""
    out: dict[str, set[str]] = {}
    for ln in text.splitlines():
        m = _SAMPLE.match(ln)
        if m and not ln.startswith("#"):
            labels = {kv.split("=", 1)[0].strip() for kv in (m.group(2) or "").split(",") if kv}
            out.setdefault(m.group(1), set()).update(labels)
    return out


def _dashboard_uses(dash: dict) -> dict[str, set[str]]:
    """A Grafana dashboard -> each berth_ metric its queries name -> the labels they use on it
    (in a selector, in ``by (...)``, in ``label_values(metric, label)``); rows' panels too."""
    exprs: list[str] = []

    def walk(panels):
        for p in panels:
            exprs.extend(t.get("expr", "") for t in p.get("targets", []))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    exprs += [v.get("query", "") if isinstance(v.get("query"), str)
              else v.get("query", {}).get("query", "")
              for v in dash.get("templating", {}).get("list", [])]
    used: dict[str, set[str]] = {}
    for e in exprs:
        lv = re.match(r"label_values\((berth_\w+)\s*,\s*(\w+)\)", e.strip())
        if lv:
            used.setdefault(lv.group(1), set()).add(lv.group(2))
            continue
        names = _SELECTOR.findall(e)
        by = {x.strip() for grp in _BY.findall(e) for x in grp.split(",") if x.strip()}
        for name, sel in names:
            labels = {kv.split("=")[0].split("!")[0].strip() for kv in sel.split(",") if kv}
            used.setdefault(name, set()).update(labels)
        for name, _ in names[:1]:          # a grouping names labels of the metric it sums
            used[name] |= by
    return used


def test_the_stream_survives_a_berthd_restart(world, browser):
    d = world.d
    page = _page(browser, world)
    try:
        d.stop()
        page.wait_for_selector("#conn.down", timeout=10000)
        d.start()
        page.wait_for_selector("#conn.up", timeout=20000)
        code, out = api(d.sock, "POST", "/v1/leases", {
            "engine": "after-restart", "owner_pid": os.getpid(),
            "shares": [{"card": "gpu0", "size": "1GiB"}]})
        assert code == 201, out
        page.wait_for_selector("#cards .seg.share[data-engine='after-restart']", timeout=20000)
    finally:
        page.context.close()


def test_metrics_on_the_board_listener_need_no_key(world):
    """Issue 29: a scraper reads ``/metrics`` on the board's port with no key (the board has
    one here), and gets berthd's figures, the same as the control socket's; the key stays for
    actions."""
    import subprocess
    curl = shutil.which("curl")
    assert curl, "curl is missing (apt-get install curl)"
    p = subprocess.run([curl, "-sS", "-o", "-", "-w", "\\n%{http_code}", world.url + "metrics"],
                       capture_output=True, text=True, timeout=30)
    body, _, code = p.stdout.rpartition("\n")
    assert code == "200", (code, body[:500], p.stderr)
    assert 'berth_card_total_bytes{card="gpu0",pci="0000:01:00.0"}' in body, body[:2000]
    assert 'berth_wait_seconds_count{kind="grant"}' in body
    _, via_socket = world.d.call("GET", "/metrics")
    names = {ln.split("{")[0].split()[0] for ln in via_socket["raw"].splitlines()
             if ln and not ln.startswith("#")}
    assert names == {ln.split("{")[0].split()[0] for ln in body.splitlines()
                     if ln and not ln.startswith("#")}
    code, _, out = world.http("POST", "operator/park", {"target": "beta"},
                              headers={"X-Berth-Board": "1"})
    assert code == 403, out


#: The board's parts, each a box of its own at any width.
PARTS = ("header", "#cards-section", "#waiting-section", "#leases-section", "#chart-section",
         "#events-section", "footer")


def _extents(page) -> dict[str, dict]:
    """Each part's box, grown to hold every box inside it (a table wider than its column
    reaches into the next one)."""
    return page.evaluate("""parts => Object.fromEntries(parts.map(sel => {
        const root = document.querySelector(sel);
        let r = root.getBoundingClientRect();
        let box = {l: r.left, t: r.top, r: r.right, b: r.bottom};
        for (const e of root.querySelectorAll('*')) {
            const q = e.getBoundingClientRect();
            if (!q.width || !q.height) continue;
            box = {l: Math.min(box.l, q.left), t: Math.min(box.t, q.top),
                   r: Math.max(box.r, q.right), b: Math.max(box.b, q.bottom)};
        }
        return [sel, box];
    }))""", list(PARTS))


def test_on_a_phone_the_board_is_one_column_with_no_overlap(world, browser, tmp_path):
    """Issue 29: at 390 px (a phone) the two columns overlapped. Now the parts stack, none
    overlaps another, and nothing is wider than the screen but inside its own scroller."""
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                              is_mobile=True, has_touch=True)
    page = ctx.new_page()
    try:
        page.goto(world.url)
        page.wait_for_selector("#conn.up")
        page.wait_for_selector("#cards .card .seg.share")
        page.wait_for_selector("#leases tbody tr")
        page.wait_for_function("() => document.querySelectorAll('#charts svg').length >= 3")
        box = _extents(page)
        width = page.evaluate("() => document.documentElement.clientWidth")
        assert width <= 390
        overlaps = [(a, b) for i, a in enumerate(PARTS) for b in PARTS[i + 1:]
                    if box[a]["l"] < box[b]["r"] - 0.5 and box[b]["l"] < box[a]["r"] - 0.5
                    and box[a]["t"] < box[b]["b"] - 0.5 and box[b]["t"] < box[a]["b"] - 0.5]
        assert not overlaps, (overlaps, box)
        wide = {p: b for p, b in box.items() if b["l"] < -0.5 or b["r"] > width + 0.5}
        assert not wide, (wide, width)
        page_wide = page.evaluate("() => document.documentElement.scrollWidth")
        assert page_wide <= width, page_wide
        tops = [box[p]["t"] for p in PARTS]
        assert tops == sorted(tops), box                  # one column, top to bottom
        shot = tmp_path / "board-390.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, OUT / "board-390.png")
    finally:
        ctx.close()


def test_an_operator_action_on_no_such_target_names_it_whole(world):
    """A fresh user's check (2026-12-03): the 404's message lost the quote closing the name
    (``no lease or engine named 'nosuch``): the board stripped quotes off the KeyError's text."""
    code, _, out = world.http("POST", "operator/park", {"target": "nosuch"},
                              headers={"Authorization": f"Bearer {KEY}"})
    assert code == 404 and out == {"error": "no lease or engine named 'nosuch'"}, out
