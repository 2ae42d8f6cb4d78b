"""Issue 12, the late free made real: a stub engine started with ``--crash-on-term`` dies by the
drain's SIGTERM without freeing, as a crashed engine or one with no handler does, so its memory
stays on the card until the driver frees it (``free_delay`` after a read first sees it gone).
berthd must grant the waiter only once a driver read shows that memory free (seed 002 rule 1), or
the waiter's load hits the simulated CUDA OOM. With a plain stub the memory went at the SIGTERM
and a grant on the exit alone was never caught."""

from __future__ import annotations

from berth.sim.cards import SimCards

from tests.berthd import wait_for
from tests.broker.conftest import Chat, engine_run, free_port, run_log, serving

FREE_DELAY_S = 3.0


def test_a_drained_engine_that_dies_without_freeing_is_waited_for(berthd, runs):
    d = berthd(free_delay=f"{FREE_DELAY_S:g}s")
    engine_run(d, runs, "A", engine_args=("--crash-on-term",))
    wait_for(lambda: serving(d, "A"), 60, "A serving")
    a_pid = d.lease_of("A")["pid"]
    sim = SimCards(d.tmp / "sim")

    def on_card() -> bool:
        return a_pid in sim.snapshot().cards[0].processes

    engine_run(d, runs, "B")
    # B needs A's room: A is drained, and its engine dies by the signal leaving 13 GiB behind.
    wait_for(lambda: "without freeing (--crash-on-term)" in run_log(d, "A"), 60,
             "A's engine to die without freeing")
    assert on_card(), "the driver freed a crashed engine's memory at its exit"
    early: list[str] = []

    def b_serving_or_early():
        """B serves; note it if B's lease was granted while A's memory was still on the card."""
        b = d.lease_of("B")
        granted = b is not None and b["shares"][0]["state"] == "active"
        if granted and on_card():
            early.append(f"B granted beside A's unfreed memory (pid {a_pid})")
        return early or serving(d, "B")

    wait_for(b_serving_or_early, 60, "B serving once the driver freed A's memory")
    assert not early, early
    assert d.sim_oom() == 0, run_log(d, "B")[-1500:]
    seen = [(e["kind"], e.get("engine")) for e in d.timeline()]
    assert seen.index(("freed", "A")) < seen.index(("grant", "B")), seen


def test_a_late_free_after_the_pid_left_the_drivers_list_is_waited_for_and_granted(berthd, runs):
    """Issue 24: real drivers drop an exited PID from the process list before its memory is
    free. The drained engine's release is then confirmed (its PID is gone) while its bytes still
    show used: that is a release under way, so B's held request waits and is answered 200 once
    the memory frees, never the immediate 503 ("nothing under way can change that") it got."""
    d = berthd(start=False, free_delay=f"{FREE_DELAY_S:g}s")
    text = d.config.read_text()
    line = f'free_delay = "{FREE_DELAY_S:g}s"'
    assert line in text, text               # the driver table this test changes
    d.config.write_text(text.replace(line, f"{line}\nlist_exited = false"))
    d.start()
    engine_run(d, runs, "A", engine_args=("--crash-on-term",))
    wait_for(lambda: serving(d, "A"), 20, "A serving")
    a_pid = d.lease_of("A")["pid"]
    sim = SimCards(d.tmp / "sim")
    front = free_port()
    engine_run(d, runs, "B", front=front)
    wait_for(lambda: "without freeing (--crash-on-term)" in run_log(d, "A"), 30,
             "A's engine to die without freeing")
    assert a_pid in sim.snapshot().cards[0].processes, "the memory was freed at the exit"
    chat = Chat(front, timeout_s=60)()             # held until B is granted and serving
    assert chat.status == 200, (chat.status, chat.body, chat.error)
    assert d.sim_oom() == 0, run_log(d, "B")[-1500:]
    seen = [(e["kind"], e.get("engine")) for e in d.timeline()]
    assert seen.index(("freed", "A")) < seen.index(("grant", "B")), seen
    waits = [e["text"] for e in d.timeline() if e["kind"] == "wait" and e["engine"] == "B"]
    assert any("left with its process" in t for t in waits), waits
