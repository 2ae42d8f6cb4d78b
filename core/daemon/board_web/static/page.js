// Berth's web board, the page (served by berth.daemon.board_web): draws berthd's status from
// server-sent events. No framework, no build step.
// Every name from berthd reaches the page through textContent or an attribute value, never
// through innerHTML (the page's CSP also forbids inline script).
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1e8e3e", "#1a73e8", "#a142f4", "#e8710a", "#00897b", "#c2185b", "#5e35b1",
                   "#f9ab00", "#3949ab", "#6d4c41"];
  const STATES = ["active", "granted", "parking", "parked", "resuming", "lent", "draining"];
  let operator = false;
  let history = [];
  let windowS = 3600;
  let last = null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }
  function size(b) {
    if (b === null || b === undefined) return "?";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Math.abs(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? "-" : "") + (i ? v.toFixed(v < 10 ? 1 : 0) : v) + " " + u[i];
  }
  function secs(s) {
    if (s === null || s === undefined) return "";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 90) return s.toFixed(s < 10 ? 1 : 0) + " s";
    return Math.round(s / 60) + " min";
  }
  function stateClass(st) {
    return "st-" + (STATES.includes(st) ? st : (st === "returning" || st === "lending" ? "lent" : "other"));
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  const colours = new Map();
  function colour(engine) {
    if (!colours.has(engine)) colours.set(engine, PALETTE[colours.size % PALETTE.length]);
    return colours.get(engine);
  }

  // -- the cards -------------------------------------------------------------------------------
  function seg(cls, bytes, total, name, detail, title) {
    const s = el("div", "seg " + cls);
    s.style.width = Math.max(0, 100 * bytes / total) + "%";
    s.appendChild(el("span", "n", name));
    if (detail) s.appendChild(el("span", "b", detail));
    s.title = title || (name + " " + (detail || ""));
    return s;
  }
  function drawLegend() {
    const lg = document.getElementById("legend");
    if (lg.childNodes.length) return;
    const items = [["reserve", "seg reserve"], ["baseline", "seg baseline"],
                   ["stowaways", "seg stowaway"], ["claims", "seg claim"]]
      .concat(STATES.map(s => [s, "seg " + stateClass(s)]));
    for (const [label, cls] of items) {
      const it = el("span");
      it.appendChild(el("span", "sw " + cls));
      it.appendChild(document.createTextNode(label));
      lg.appendChild(it);
    }
  }
  function drawCards(st) {
    drawLegend();
    const root = document.getElementById("cards");
    clear(root);
    for (const c of st.cards) {
      const box = el("div", "card");
      box.dataset.card = c.name;
      const t = el("div", "card-title");
      t.appendChild(el("span", null, c.name));
      t.appendChild(el("span", "sub", c.pci + " · " + size(c.total_bytes) + " · free " +
                       size(c.free_bytes) + " · available " + size(c.available_bytes)));
      box.appendChild(t);
      const bar = el("div", "bar");
      const T = c.total_bytes || 1;
      if (c.reserve_bytes) bar.appendChild(seg("reserve", c.reserve_bytes, T, "reserve", size(c.reserve_bytes)));
      if (c.baseline_bytes) bar.appendChild(seg("baseline", c.baseline_bytes, T, "baseline", size(c.baseline_bytes)));
      const stow = c.stowaways || [];
      if (c.stowaway_bytes) {
        const pids = stow.map(s => s.pid).join(", ");
        bar.appendChild(seg("stowaway", c.stowaway_bytes, T, "stowaways",
                            (pids ? "pid " + pids + " · " : "") + size(c.stowaway_bytes)));
      }
      for (const [who, b] of Object.entries(c.claims || {})) {
        bar.appendChild(seg("claim", b, T, "claim " + who, size(b)));
      }
      for (const sh of c.shares) {
        const s = seg("share " + stateClass(sh.state), sh.counted_bytes, T, sh.engine,
                      sh.state + " · " + size(sh.counted_bytes),
                      sh.engine + ": " + sh.state + ", " + size(sh.counted_bytes) + (sh.held ? ", held" : ""));
        s.dataset.engine = sh.engine;
        s.dataset.state = sh.state;
        s.dataset.lease = sh.lease;
        bar.appendChild(s);
      }
      box.appendChild(bar);
      const notes = [];
      if (stow.length) notes.push("stowaways: " + stow.map(s => "pid " + s.pid +
          (s.program ? " " + s.program + " (user " + s.user + ")" : "") + " " + size(s.bytes)).join(", "));
      // Processes that left a run's tree and still hold memory here, counted for its lease
      // (escapees): named with the lease, as berth status names them.
      for (const le of st.leases) {
        const out = (le.escapees || []).filter(e => e.card === c.pci);
        if (out.length) notes.push("escapees of " + le.engine + ": " + out.map(e => "pid " +
            e.pid + " " + size(e.bytes || 0)).join(", ") + " (left its run's tree; counted for it)");
      }
      if (c.reserve_below_suggested) notes.push("reserve below the suggested " + size(c.suggested_reserve_bytes));
      if (notes.length) box.appendChild(el("div", "card-notes", notes.join(" · ")));
      root.appendChild(box);
    }
    // Parked shares in host RAM, against its budget.
    const ram = document.getElementById("ram");
    clear(ram);
    const h = st.host_ram || {};
    const parked = [];
    for (const le of st.leases) for (const sh of le.shares) {
      if (sh.in_ram_bytes) parked.push([le.engine, sh]);
    }
    const box = el("div", "card");
    box.dataset.card = "host RAM";
    const t = el("div", "card-title");
    t.appendChild(el("span", null, "host RAM (parked)"));
    t.appendChild(el("span", "sub", size(h.parked_bytes || 0) + " parked of a " + size(h.budget_bytes) + " budget"));
    box.appendChild(t);
    const bar = el("div", "bar");
    const T = h.budget_bytes || 1;
    for (const [engine, sh] of parked) {
      const b = sh.in_ram_bytes;
      const s = seg("share " + stateClass(sh.state), b, T, engine,
                    sh.state + " · " + size(b) + " from " + sh.card_name);
      s.dataset.engine = engine;
      bar.appendChild(s);
    }
    box.appendChild(bar);
    ram.appendChild(box);
  }

  // -- waiting, leases, events -----------------------------------------------------------------
  function drawWaiting(st) {
    const root = document.getElementById("waiting");
    clear(root);
    if (!st.waiting.length && !(st.drained || []).length) {
      root.appendChild(el("li", "empty", "nobody waits"));
    }
    for (const w of st.waiting) {
      const li = el("li");
      li.dataset.engine = w.engine;
      li.appendChild(el("strong", null, w.engine));
      li.appendChild(document.createTextNode(" waits for its " + w.kind + " (" +
        w.need.map(n => size(n.size_bytes) + " on " + n.card_name).join(", ") + ")"));
      li.appendChild(el("span", "why", w.why || ""));
      let eta = "waiting " + secs(w.waited_s);
      if (w.expected_wait_s !== null && w.expected_wait_s !== undefined) {
        eta += " · expected about " + secs(w.expected_wait_s) + " more (mean so far)";
      }
      if (w.note) eta += " · " + w.note;
      li.appendChild(el("span", "eta", eta));
      root.appendChild(li);
    }
    drawDrained(root, st.drained || []);
  }
  // Runs whose engine was drained and whose front stays: the next request starts
  // the engine again; their waiters are the requests their front holds.
  function drawDrained(root, drained) {
    for (const r of drained) {
      const li = el("li", "drained");
      li.dataset.engine = r.engine;
      li.appendChild(el("strong", null, r.engine));
      const held = r.waiters ? " · " + r.waiters + " request(s) waiting" +
        (r.asking ? ", asking for a card" : "") : "";
      li.appendChild(document.createTextNode(
        (r.move_to ? " moving to " + r.move_to + ", its front holds requests" :
          " drained, its front stays") + held));
      li.appendChild(el("span", "why", r.why || ""));
      li.appendChild(el("span", "eta", "drained " + secs(r.drained_s) + " ago"));
      root.appendChild(li);
    }
  }
  // When a holder's protections end (berthd's status: turn_until, keep_warm_until, seconds
  // since the epoch): its minimum turn while it serves, its keep_warm after its last request.
  function until(le) {
    const at = t => new Date(t * 1000).toLocaleTimeString();
    const parts = [];
    if (le.held) parts.push("held");
    if (le.turn_until && !le.idle) parts.push("turn " + at(le.turn_until));
    if (le.keep_warm_until) parts.push("keep_warm " + at(le.keep_warm_until));
    // An idle holder's forecast of its demand, in words: why it keeps its card
    // or yields ("A yields at once: its client is waiting on B").
    if (le.demand && le.demand.why) parts.push(le.demand.why);
    return parts.join(" · ");
  }
  function opButton(op, target) {
    const b = el("button", "op", op);
    b.type = "button";
    b.dataset.op = op;
    b.dataset.target = target;
    b.addEventListener("click", () => act(op, target));
    return b;
  }
  function sizeWords(le, sh) {
    if (le.bound === "declared") return size(sh.size_bytes);
    return size(sh.reserved_bytes) + " of a " + size(sh.size_bytes) + " ceiling";
  }
  function drawLeases(st) {
    const body = document.querySelector("#leases tbody");
    clear(body);
    const costs = st.switch_costs || {};
    for (const le of st.leases) {
      for (const sh of le.shares) {
        const tr = el("tr");
        tr.dataset.engine = le.engine;
        tr.appendChild(el("td", null, le.engine + (le.held ? " (held)" : "")));
        tr.appendChild(el("td", null, sh.card_name));
        const s = el("td");
        s.appendChild(el("span", "pill " + stateClass(sh.state), sh.state));
        tr.appendChild(s);
        // The lease's size, never the driver's read of its use (a 3 GiB lease whose engine
        // had not loaded yet showed "0 B"); a bound other than declared makes the size a
        // ceiling, and what the lease counts now is said beside it.
        const sz = el("td", "size", sizeWords(le, sh));
        sz.dataset.sizeBytes = sh.size_bytes;
        tr.appendChild(sz);
        tr.appendChild(el("td", "used", sh.used_bytes === null ? "—" : size(sh.used_bytes) +
                          (sh.peak_bytes ? " (peak " + size(sh.peak_bytes) + ")" : "")));
        tr.appendChild(el("td", "wide", le.pid === null ? "" : le.pid));
        const c = costs[le.engine];
        tr.appendChild(el("td", "wide", c ? ["park", "restore", "cold_start"]
          .filter(k => c[k + "_s"] !== null && c[k + "_s"] !== undefined)
          .map(k => k.replace("_", " ") + " " + secs(c[k + "_s"])).join(", ") : ""));
        tr.appendChild(el("td", "until", until(le)));
        const ops = el("td", "ops");
        if (operator) {
          for (const op of ["park", "wake", "drain", le.held ? "release-hold" : "hold"]) {
            ops.appendChild(opButton(op, le.id));
          }
        }
        tr.appendChild(ops);
        body.appendChild(tr);
      }
    }
  }
  function drawEvents(evs) {
    const root = document.getElementById("events");
    clear(root);
    if (!evs.length) root.appendChild(el("li", "empty", "nothing yet"));
    for (const e of evs.slice().reverse()) {
      const li = el("li");
      li.dataset.kind = e.kind;
      li.appendChild(el("span", "when", new Date(e.wall * 1000).toLocaleTimeString() + " "));
      li.appendChild(el("span", "kind", e.kind));
      li.appendChild(el("span", "text", e.text || ""));
      root.appendChild(li);
    }
  }

  // -- the hour's chart ------------------------------------------------------------------------
  function chart(title, series, maxY, t0, t1, fmt, stacked) {
    const W = 600, H = 140, L = 4, R = 4, TOP = 14, B = 4;
    const box = el("div", "chart");
    box.appendChild(el("div", "title", title));
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    const x = t => L + (W - L - R) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
    const y = v => H - B - (H - TOP - B) * (maxY > 0 ? v / maxY : 0);
    const base = series.length ? series[0].points.map(() => 0) : [];
    const lg = svg("g", {});
    let lx = 6;
    for (const ser of series) {
      const pts = ser.points;
      if (!pts.length) continue;
      const top = pts.map((p, i) => (stacked ? base[i] : 0) + p[1]);
      let d;
      if (stacked) {
        d = "M" + pts.map((p, i) => x(p[0]) + "," + y(top[i])).join(" L") + " L" +
            pts.slice().reverse().map((p, j) => x(p[0]) + "," + y(base[pts.length - 1 - j])).join(" L") + " Z";
        s.appendChild(svg("path", { d, fill: ser.colour, "fill-opacity": 0.75, stroke: ser.colour }));
        top.forEach((v, i) => { base[i] = v; });
      } else {
        d = "M" + pts.map(p => x(p[0]) + "," + y(p[1])).join(" L");
        s.appendChild(svg("path", { d, fill: "none", stroke: ser.colour, "stroke-width": 2 }));
      }
      const label = svg("text", { x: lx, y: 11, fill: ser.colour, "font-size": 11 });
      label.textContent = ser.name;
      lg.appendChild(label);
      lx += 8 + 6.5 * ser.name.length;
    }
    const mx = svg("text", { x: W - 6, y: 11, "text-anchor": "end", fill: "#6b6b70", "font-size": 11 });
    mx.textContent = "max " + fmt(maxY);
    s.appendChild(lg);
    s.appendChild(mx);
    box.appendChild(s);
    return box;
  }
  function drawCharts() {
    const root = document.getElementById("charts");
    clear(root);
    if (!history.length) return;
    const t1 = history[history.length - 1].wall, t0 = Math.max(history[0].wall, t1 - windowS);
    const pts = history.filter(h => h.wall >= t0);
    const cards = new Set();
    pts.forEach(h => Object.keys(h.cards).forEach(c => cards.add(c)));
    for (const card of cards) {
      const engines = new Set();
      let total = 0;
      pts.forEach(h => { const c = h.cards[card]; if (c) { total = Math.max(total, c.total || 0); Object.keys(c.engines).forEach(e => engines.add(e)); } });
      const series = [...engines].map(e => ({ name: e, colour: colour(e),
        points: pts.map(h => [h.wall, (h.cards[card] && h.cards[card].engines[e]) || 0]) }));
      root.appendChild(chart(card + ": occupancy by engine", series, total, t0, t1, size, true));
    }
    const keys = ["admissions_rejected_with_free", "parks", "drains", "fallbacks_to_drain", "lends"];
    const counters = keys.map((k, i) => ({ name: k.replace(/_/g, " "), colour: PALETTE[i],
      points: pts.map(h => [h.wall, (h.counters || {})[k] || 0]) }));
    const maxC = Math.max(1, ...counters.flatMap(c => c.points.map(p => p[1])));
    root.appendChild(chart("counters: waited with some memory free, not enough; parks, drains, fallbacks, lends", counters, maxC, t0, t1, v => String(Math.round(v)), false));
    const rf = [{ name: "reserve fraction", colour: "#5f6368",
      points: pts.map(h => [h.wall, (h.counters || {}).reserve_fraction || 0]) }];
    root.appendChild(chart("reserve fraction", rf, Math.max(0.01, ...rf[0].points.map(p => p[1])), t0, t1, v => v.toFixed(3), false));
  }

  // -- live ------------------------------------------------------------------------------------
  function setConn(up, text) {
    const c = document.getElementById("conn");
    c.className = "conn " + (up ? "up" : "down");
    c.textContent = text;
  }
  function setOperator(on, who) {
    operator = !!on;
    document.body.classList.toggle("operator", operator);
    document.getElementById("who").textContent = operator ? "operator: " + who : "read-only";
    document.getElementById("login").hidden = operator;
    document.getElementById("logout").hidden = !operator;
  }
  function draw(doc) {
    last = doc;
    const st = doc.status;
    document.getElementById("meta").textContent = "driver " + st.driver + " · up " + secs(st.uptime_s) +
      " · " + st.leases.length + " lease(s), " + st.waiting.length + " waiting" +
      // the adapters berthd loaded: what an engine entry's adapter may name
      (st.adapters ? " · adapters: " + (st.adapters.join(", ") || "none") : "");
    drawCards(st);
    drawWaiting(st);
    drawLeases(st);
    drawEvents(doc.events || []);
    const p = doc.history && doc.history.last;
    if (p && (!history.length || history[history.length - 1].wall < p.wall)) {
      history.push(p);
      while (history.length && history[0].wall < p.wall - windowS) history.shift();
    }
    drawCharts();
    document.body.dataset.version = String((Number(document.body.dataset.version) || 0) + 1);
  }
  async function post(path, body) {
    const r = await fetch(path, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Berth-Board": "1" }, body: JSON.stringify(body) });
    let doc = {};
    try { doc = await r.json(); } catch (e) { /* an answer without JSON */ }
    return [r.status, doc];
  }
  async function act(op, target) {
    const [code, doc] = await post("operator/" + op, { target });
    if (code !== 200) setConn(true, op + " refused: " + (doc.error || code));
  }
  function connect() {
    const es = new EventSource("events");
    es.addEventListener("hello", ev => {
      const h = JSON.parse(ev.data);
      setOperator(h.operator, h.who);
      history = h.history || [];
      windowS = h.window_s || windowS;
      setConn(true, "live");
      if (last) draw(last);
    });
    es.addEventListener("board", ev => {
      setConn(true, "live");
      draw(JSON.parse(ev.data));
    });
    es.onerror = () => setConn(false, "reconnecting");   // EventSource retries by itself
  }
  document.addEventListener("DOMContentLoaded", () => {
    setOperator(false, null);
    document.getElementById("login").addEventListener("submit", async ev => {
      ev.preventDefault();
      const [code, doc] = await post("login", { name: document.getElementById("login-name").value,
                                                key: document.getElementById("login-key").value });
      document.getElementById("login-key").value = "";
      document.getElementById("login-msg").textContent = code === 200 ? "" : (doc.error || String(code));
      if (code === 200) { setOperator(true, doc.who); if (last) draw(last); }
    });
    document.getElementById("logout").addEventListener("click", async () => {
      await post("logout", {});
      setOperator(false, null);
      if (last) draw(last);
    });
    connect();
  });
})();
