"""Issue 35, live: a checkpointed engine restored onto another simulated card of the same kind
(``cuda-checkpoint --device-map``, driver 580+), its lease and process kept; across chip kinds
the tool refuses with its reason, berthd falls back to a drain, and the run starts the engine
again on the card it is given, its front holding the request meanwhile.

Two 24 GiB simulated cards (1 GiB reserve). Y holds 14 GiB of gpu1 by name, so X (10 GiB,
``--park checkpoint``, placed by Berth) goes on gpu0; W asks 20 GiB of gpu0 by name, and X is
parked for it (no move can make that room: X fits nowhere else). Y leaves; X's client asks: the
wake is placed on gpu1, where X fits now, instead of waiting for gpu0.
"""

from __future__ import annotations

from tests.berthd import READ_INTERVAL, RELEASE_GRACE, Berthd, berth_run, stop_proc
from tests.broker.conftest import CHECKPOINT
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
model = "L4"
[[driver.cards]]
pci = "0000:02:00.0"
name = "gpu1"
total = "24GiB"
model = "{kind1}"
[cards.gpu0]
reserve = "1GiB"
[cards.gpu1]
reserve = "1GiB"
[board]
listen = "off"
[policy]
read_interval = "{read}"
release_grace = "{grace}"
"""


def _share(d: Berthd, engine: str) -> tuple[str, str, str] | None:
    """(lease id, card name, state) of ``engine``'s one share, or None."""
    le = d.lease_of(engine)
    if le is None or len(le["shares"]) != 1:
        return None
    sh = le["shares"][0]
    return le["id"], sh["card_name"], sh["state"]


def _x_parked_for_w(tmp_path, procs: dict, kind1: str) -> tuple[Berthd, int, str]:
    """The module's shape up to Y's leaving. Returns berthd, X's front port, X's lease id."""
    cfg = tmp_path / "berth.toml"
    cfg.write_text(CONFIG.format(tmp=tmp_path, read=READ_INTERVAL, grace=RELEASE_GRACE,
                                 kind1=kind1))
    d = Berthd(tmp_path, cfg).start()
    procs["berthd"] = d.proc
    procs["Y"] = berth_run(d, "Y", "--size", "14GiB@gpu1", weights="13GiB")
    wait_for(lambda: (_share(d, "Y") or ("", "", ""))[2] == "active", 60, "Y serving on gpu1")
    port = free_port()
    procs["X"] = berth_run(d, "X", "--front", f"127.0.0.1:{port}", "--size", "10GiB", "--park",
                           "checkpoint", "--checkpoint-path", CHECKPOINT, weights="9GiB")
    wait_for(lambda: (d.lease_of("X") or {}).get("ready"), 60, "X serving")
    x_id, card, _ = _share(d, "X")
    assert card == "gpu0", card
    assert d.lease_of("X")["move"]["restore_across"] is True     # the tool has --device-map
    assert chat(port, "X").finish_reason
    procs["W"] = berth_run(d, "W", "--size", "20GiB@gpu0", weights="19GiB")
    wait_for(lambda: (_share(d, "W") or ("", "", ""))[2] == "active", 120, "W granted")
    assert _share(d, "X") == (x_id, "gpu0", "parked")
    assert stop_proc(procs.pop("Y")) == 0            # stopped by SIGTERM (main.py step 5)
    wait_for(lambda: d.lease_of("Y") is None, 30, "Y gone")
    return d, port, x_id


def test_a_checkpoint_is_restored_onto_another_card_of_the_same_kind(tmp_path):
    procs: dict = {}
    try:
        d, port, x_id = _x_parked_for_w(tmp_path, procs, kind1="L4")
        assert chat(port, "X", timeout_s=120).finish_reason
        # The same lease and process, now on gpu1; W kept gpu0; nothing drained.
        wait_for(lambda: _share(d, "X") == (x_id, "gpu1", "active"), 30, "X active on gpu1")
        assert _share(d, "W")[1:] == ("gpu0", "active")
        counters = d.status()["counters"]
        assert counters["drains"] == 0 and counters["fallbacks_to_drain"] == 0, counters
        resumed = [e["text"] for e in d.timeline() if e["kind"] == "resume"]
        assert any("restored onto gpu1" in t for t in resumed), resumed
        assert "restored onto another card (gpu0→gpu1)" in (tmp_path / "run-X.log").read_text()
        assert chat(port, "X").finish_reason
    finally:
        stop_all(list(procs.values()), tmp_path)
    assert d.sim_oom() == 0


def test_across_kinds_the_restore_is_refused_with_its_reason_and_the_engine_restarted(tmp_path):
    procs: dict = {}
    try:
        d, port, x_id = _x_parked_for_w(tmp_path, procs, kind1="A10")
        # The request is held through the refused restore, the drain and the restart.
        assert chat(port, "X", timeout_s=120).finish_reason
        got = _share(d, "X")
        assert got is not None and got[0] != x_id and got[1:] == ("gpu1", "active"), got
        # Its new lease claims no restore across cards: none would be placed to be refused.
        assert d.lease_of("X")["move"]["restore_across"] is False
        falls = [e["text"] for e in d.timeline() if e["kind"] == "fallback"]
        assert any("same kind" in t and "falling back to drain" in t for t in falls), falls
        log = (tmp_path / "run-X.log").read_text()
        assert "the restore onto another card (gpu0→gpu1) was refused" in log, log
        assert "a checkpoint restores only onto a card of the same kind" in log
        assert chat(port, "X").finish_reason
    finally:
        stop_all(list(procs.values()), tmp_path)
    assert d.sim_oom() == 0
