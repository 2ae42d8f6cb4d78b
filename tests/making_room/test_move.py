"""Issue 35, live: the two-card shape, on berthd's default policy.

Two simulated 24 GiB cards (1 GiB reserve). A (8 GiB) and B (12 GiB) are placed on one card, C
(10 GiB) on the other; A leaves; B and C each serve a busy client; W asks for 20 GiB, which fits
on neither card as it is. Before issue 35 W waited for a turn to end and one of the busy engines
was drained. Now one of them is moved beside the other (its run stops its engine and starts it
again on the other card, its front holding its client's requests meanwhile): W is granted with
nothing parked or drained, and every request of B's and C's clients is answered 200.
"""

from __future__ import annotations

import subprocess
import threading

from tests.berthd import BERTH, READ_INTERVAL, Berthd, berth_run, stop_proc
from tests.helpers import free_port, stop_all, wait_for
from tests.run.world import chat

CONFIG = """\
state_dir = "{tmp}/state"
[driver]
kind = "sim"
sim_dir = "{tmp}/sim"
free_delay = "0.1s"
[[driver.cards]]
pci = "0000:01:00.0"
name = "gpu0"
total = "24GiB"
[[driver.cards]]
pci = "0000:02:00.0"
name = "gpu1"
total = "24GiB"
[cards.gpu0]
reserve = "1GiB"
[cards.gpu1]
reserve = "1GiB"
[board]
listen = "off"
[policy]
read_interval = "{read}"
"""


def _card(d: Berthd, engine: str) -> str | None:
    le = d.lease_of(engine)
    if le is None or [s["state"] for s in le["shares"]] != ["active"] or not le["ready"]:
        return None
    return le["shares"][0]["card_name"]


class Client(threading.Thread):
    """A busy client: chats back to back until told to stop; every answer is kept."""

    def __init__(self, port: int, model: str):
        super().__init__(daemon=True)
        self.port, self.model = port, model
        self.done = threading.Event()
        self.answers: list[str] = []

    def run(self) -> None:
        while not self.done.is_set():
            try:
                a = chat(self.port, self.model, max_tokens=8, timeout_s=120)
                self.answers.append("200" if a.finish_reason else f"cut: {a}")
            except Exception as e:                # noqa: BLE001 (the test reports each)
                self.answers.append(repr(e))


SIZES = {"A": ("8GiB", "7GiB"), "B": ("12GiB", "11GiB"), "C": ("10GiB", "9GiB"),
         "W": ("20GiB", "19GiB")}


def _shape(tmp_path, procs: dict, pins: tuple[str, ...] = (),
           extra: tuple[str, ...] = (), env: dict | None = None,
           engine_flags: tuple[str, ...] = ()) -> tuple[Berthd, dict, list]:
    """berthd on the two cards; A and B on one card, C on the other, A gone, B's and C's busy
    clients started. ``pins``: engines whose run line pins their card (``--option
    device=N``); ``extra``: more flags for every run line; ``env``: more environment for
    berthd and the runs; ``engine_flags``: more flags for every stub engine. Returns berthd,
    the front ports and the clients."""
    (tmp_path / "berth.toml").write_text(CONFIG.format(tmp=tmp_path, read=READ_INTERVAL))
    d = Berthd(tmp_path, tmp_path / "berth.toml")
    d.env.update(env or {})
    d.start()
    procs["berthd"] = d.proc
    ports = {n: free_port() for n in "ABCW"}
    for n in "ABC":
        pin = ("--option", "device=0") if n in pins else ()
        procs[n] = berth_run(d, n, "--front", f"127.0.0.1:{ports[n]}", "--size", SIZES[n][0],
                             *pin, *extra, weights=SIZES[n][1],
                             extra_engine=("--tokens-per-s", "40", *engine_flags))
        wait_for(lambda n=n: _card(d, n), 60, f"{n} serving")
    cards = {n: _card(d, n) for n in "ABC"}
    assert cards["A"] == cards["B"] != cards["C"], cards     # best fit keeps holes whole
    assert stop_proc(procs.pop("A")) == 0            # stopped by SIGTERM (main.py step 5)
    wait_for(lambda: d.lease_of("A") is None, 30, "A gone")
    clients = [Client(ports[n], n) for n in "BC"]
    for c in clients:
        c.start()
    wait_for(lambda: all(c.answers for c in clients), 60, "both clients answered")
    return d, ports, clients


def _end(clients: list, procs: dict, tmp_path) -> None:
    for c in clients:
        c.done.set()
    for c in clients:
        c.join(130)
    stop_all(list(procs.values()), tmp_path)


def test_a_busy_engine_moves_beside_the_other_so_the_waiter_fits(tmp_path):
    procs: dict = {}
    clients: list[Client] = []
    try:
        d, ports, clients = _shape(tmp_path, procs)
        sizes = SIZES
        procs["W"] = berth_run(d, "W", "--front", f"127.0.0.1:{ports['W']}", "--size",
                               sizes["W"][0], weights=sizes["W"][1])
        wait_for(lambda: _card(d, "W"), 120, "W granted and serving")
        wait_for(lambda: _card(d, "B") and _card(d, "C"), 120, "B and C serving again")
        assert _card(d, "B") == _card(d, "C") != _card(d, "W")
        counters = d.status()["counters"]
        assert counters["moves"] >= 1, counters
        assert (counters["parks"], counters["checkpoints"], counters["drains"]) == (0, 0, 0), \
            counters
        n0 = [len(c.answers) for c in clients]
        wait_for(lambda: all(len(c.answers) > k for c, k in zip(clients, n0, strict=True)),
                 60,
                 "both clients answered after the move")
        grant = [e for e in d.timeline() if e["kind"] == "grant" and "W granted" in e["text"]]
        assert grant and "(move)" in grant[0]["text"], grant
        assert [e for e in d.timeline() if e["kind"] == "move"]
    finally:
        _end(clients, procs, tmp_path)
    for c in clients:
        assert c.answers and all(a == "200" for a in c.answers), (c.model, c.answers)
    assert d.sim_oom() == 0


def test_engines_that_pin_their_card_are_never_moved_and_the_waiter_gets_the_usual_answer(
        tmp_path):
    procs: dict = {}
    clients: list[Client] = []
    try:
        d, ports, clients = _shape(tmp_path, procs, pins=("B", "C"))
        for n in "BC":
            move = d.lease_of(n)["move"]
            assert not move["movable"] and "option device=0" in move["why"], move
        procs["W"] = berth_run(d, "W", "--front", f"127.0.0.1:{ports['W']}", "--size",
                               SIZES["W"][0], weights=SIZES["W"][1])
        # The ladder's usual answer: W waits, saying why, while B and C serve their turns.
        w = wait_for(lambda: next((w for w in d.status()["waiting"] if w["engine"] == "W"),
                                  None), 60, "W waiting")
        assert w["why"], w
        assert d.status()["counters"]["moves"] == 0
        assert not [e for e in d.timeline() if e["kind"] == "move"]
    finally:
        _end(clients, procs, tmp_path)


def test_a_checkpointed_engine_moves_by_restore_onto_the_other_card(tmp_path):
    """The same shape with B and C parked by checkpoint, whose stand-in tool restores onto
    another card (``--device-map``): the move is a checkpoint and a restore of the same process
    under the same lease, not a restart; W is granted with nothing drained."""
    from tests.broker.conftest import CHECKPOINT

    procs: dict = {}
    clients: list[Client] = []
    try:
        d, ports, clients = _shape(tmp_path, procs,
                                   extra=("--park", "checkpoint", "--checkpoint-path", CHECKPOINT))
        ids = {n: d.lease_of(n)["id"] for n in "BC"}
        procs["W"] = berth_run(d, "W", "--front", f"127.0.0.1:{ports['W']}", "--size",
                               SIZES["W"][0], weights=SIZES["W"][1])
        wait_for(lambda: _card(d, "W"), 120, "W granted and serving")
        wait_for(lambda: _card(d, "B") and _card(d, "C"), 120, "B and C serving again")
        assert _card(d, "B") == _card(d, "C") != _card(d, "W")
        assert {n: d.lease_of(n)["id"] for n in "BC"} == ids          # same leases
        counters = d.status()["counters"]
        assert counters["moves"] >= 1 and counters["drains"] == 0, counters
        moves = [e["text"] for e in d.timeline() if e["kind"] == "move"]
        assert moves and all("by checkpoint and restore" in t for t in moves), moves
        n0 = [len(c.answers) for c in clients]
        wait_for(lambda: all(len(c.answers) > k for c, k in zip(clients, n0, strict=True)),
                 60, "both clients answered after the move")
    finally:
        _end(clients, procs, tmp_path)
    for c in clients:
        assert c.answers and all(a == "200" for a in c.answers), (c.model, c.answers)
    assert d.sim_oom() == 0


def test_status_and_the_board_show_a_move_by_restore_while_it_happens(tmp_path):
    """While B or C moves by checkpoint and restore (the stand-in tool's restore held by
    ``$BERTH_SIM_RESTORE_HOLD`` until the test has seen the move in both), ``berth status
    --json`` gives the lease's move (from, to, why, how long) and ``berth status`` says "moving
    gpuX -> gpuY" with the waiter it makes room for; once it woke on the other card the move is
    gone from both and the timeline says where it woke and how long the move took. Before the
    hold, the tool was slowed to 2 GB/s so that the move lasted seconds."""
    from tests.broker.conftest import CHECKPOINT

    procs: dict = {}
    clients: list[Client] = []
    hold = tmp_path / "restore-hold"
    try:
        d, ports, clients = _shape(tmp_path, procs,
                                   extra=("--park", "checkpoint", "--checkpoint-path", CHECKPOINT),
                                   env={"BERTH_SIM_RESTORE_HOLD": str(hold)})
        hold.touch()              # no restore in the setup; the move's restore waits
        procs["W"] = berth_run(d, "W", "--front", f"127.0.0.1:{ports['W']}", "--size",
                               SIZES["W"][0], weights=SIZES["W"][1])
        le = wait_for(lambda: next((le for le in d.status()["leases"] if le.get("moving")),
                                   None), 60, "a lease moving")
        m = le["moving"]
        assert {*m["from"], m["to"]} == {"gpu0", "gpu1"} and m["from"] != [m["to"]], m
        assert "W" in m["why"] and m["elapsed_s"] >= 0, m
        text = wait_for(lambda: (t := subprocess.run(
            [BERTH, "status"], env=d.env, capture_output=True, text=True, timeout=30).stdout)
            and f"moving {m['from'][0]} -> {m['to']} for" in t and t, 60, "the board's move line")
        line = next(x for x in text.splitlines() if "moving gpu" in x)
        assert le["engine"] in line and "W" in line, text
        hold.unlink()             # the restore finishes: the move can end
        wait_for(lambda: _card(d, "W") and _card(d, le["engine"]) == m["to"], 120,
                 "W serving and the moved engine serving on its new card")
        assert not any(x.get("moving") for x in d.status()["leases"])
        woke = [e["text"] for e in d.timeline() if e["kind"] == "wake"
                and e["text"].startswith(le["engine"])]
        assert woke and f"its move from {m['from'][0]} done in" in woke[-1], woke
    finally:
        hold.unlink(missing_ok=True)
        _end(clients, procs, tmp_path)
    assert d.sim_oom() == 0


def _status_text(d: Berthd) -> str:
    return subprocess.run([BERTH, "status"], env=d.env, capture_output=True, text=True,
                          timeout=30).stdout


def _moving_run(d: Berthd) -> tuple[str, dict] | None:
    return next(((r["engine"], r["moving"]) for r in d.status()["drained"] if r.get("moving")),
                None)


def test_status_and_the_board_show_a_move_by_restart_as_a_move(tmp_path):
    """A move by restart (no checkpoint) shows as a move while it happens: ``berth status
    --json`` gives the moving run's ``moving`` (from, to, why, how long, ``how`` "restart") on
    its drained entry until its engine serves on the other card, and ``berth status`` says
    "moving gpuX -> gpuY for Ns: why" and lists no drained run. Before, it was listed as a
    drained run ("moving to 0000:02:00.0 for 2s", no card it left), with no ``moving``.

    The moved engine's load on its new card is held (the stub's ``--load-hold``) until the test
    has seen the move in both, so the move lasts exactly as long as the test needs: before, every
    engine loaded for 5 s times the machine's slowness, and at load 13 a 5 s move ended before
    the text read began."""
    procs: dict = {}
    clients: list[Client] = []
    hold = tmp_path / "load-hold"
    try:
        d, ports, clients = _shape(tmp_path, procs, engine_flags=("--load-hold", str(hold)))
        hold.touch()              # the setup's engines loaded; the moved one's next load waits
        procs["W"] = berth_run(d, "W", "--front", f"127.0.0.1:{ports['W']}", "--size",
                               SIZES["W"][0], weights=SIZES["W"][1])
        engine, m = wait_for(lambda: _moving_run(d), 60, "a run moving by restart")
        assert {*m["from"], m["to"]} == {"gpu0", "gpu1"} and m["from"] != [m["to"]], m
        assert m["how"] == "restart" and "W" in m["why"] and m["elapsed_s"] >= 0, m
        text = wait_for(lambda: (t := _status_text(d)) and f"moving {m['from'][0]} -> "
                        f"{m['to']} for" in t and t, 60, "the board's move line")
        line = next(x for x in text.splitlines() if "moving gpu" in x)
        assert engine in line and "W" in line and "restart" in line, text
        assert "drained (" not in text, text
        # Still moving while the load is held, the same move, its clock running.
        again = _moving_run(d)
        assert again and again[0] == engine, again
        assert {k: again[1][k] for k in ("from", "to", "how")} == \
            {k: m[k] for k in ("from", "to", "how")}, (again, m)
        assert again[1]["elapsed_s"] >= m["elapsed_s"], (again, m)
        assert _card(d, engine) is None
        hold.unlink()             # the load finishes: the move can end
        wait_for(lambda: _card(d, "W") and _card(d, engine) == m["to"], 120,
                 "W serving and the moved engine serving on its new card")
        wait_for(lambda: _moving_run(d) is None, 30, "the move gone from the board")
        counters = d.status()["counters"]
        assert counters["drains"] == 0 and counters["moves"] >= 1, counters
    finally:
        hold.unlink(missing_ok=True)
        _end(clients, procs, tmp_path)
    assert d.sim_oom() == 0
