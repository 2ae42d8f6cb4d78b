"""The policy simulator's accounting (bench/policy): conservation of bytes, hand-computed waits,
OOM detection from the simulated driver, and a short run of the whole simulator.

These check the simulator's books, not its timings against any target. No sleeps: everything
runs in virtual time.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import replace

import pytest
from berth.run.probe import seen_at

from bench.policy import run as runner
from bench.policy.policies import BERTH, DEFAULT, POLICIES, make
from bench.policy.policies.berth import DEFAULT_KNOBS, next_poll
from bench.policy.policies.swap import card_components, fitting_sets
from bench.policy.verdict import verdict
from bench.policy.workload import CardSpec, EngineSpec, Mechanisms, RequestSpec, Workload
from bench.policy.world import World

P = "0000:01:00.0"

# Round numbers so the waits below can be worked out by hand: a load of 7e9 bytes takes
# init 2 s + 7e9 / 1 GB/s = 9 s; a checkpoint of 7e9 bytes at 70 GB/s takes 0.1 s, a restore
# at 8 GB/s 0.875 s; a stop takes 0.9 s to exit and the driver shows the memory free 1 s later.
MECH = Mechanisms(restore_gbps=8.0, checkpoint_gbps=70.0, reload_gbps=1.0, init_s=2.0,
                  drain_s=0.9, free_lag_s=1.0)


def tiny(requests, *, total=20 * 10**9, reserve=10**9, size=12 * 10**9, base=7 * 10**9):
    """One card, engines ``a`` and ``b`` (12e9 declared, 7e9 loaded): both fit by their load,
    not by their declared size."""
    engines = tuple(EngineSpec(name=n, size_bytes={P: size}, base_bytes={P: base}, slots=2)
                    for n in ("a", "b"))
    return Workload(name="tiny", description="hand-computed", seed=0, duration_s=100.0,
                    host_ram_bytes=64 * 10**9, cards=(CardSpec(P, "gpu0", total, reserve),),
                    engines=engines, requests=tuple(RequestSpec(*r) for r in requests),
                    mechanisms=MECH).validate()


# a at 0, b at 30, a again at 50; each serves 5 s and grows nothing.
TRACE = [(0.0, "a", 5.0, 0, 0.0), (30.0, "b", 5.0, 0, 0.0), (50.0, "a", 5.0, 0, 0.0)]


def waits(policy: str, wl: Workload) -> list[float]:
    world = World(wl, make(policy), check=True)
    world.run()
    return [j.wait_s for j in world.jobs]


class TestHandComputedWaits:
    def test_swap(self):
        # a: load 9 s, seen ready at llama-swap's poll (0.25 s, then every second): 9.25.
        # b: a is idle, so stop it (exits at 30.9), then load b: ready at 30.9 + 9.25.
        # a again: the same swap back: 50.9 + 9.25.
        assert waits("swap", tiny(TRACE)) == pytest.approx([9.25, 10.15, 10.15])

    def test_keepalive_evict(self):
        # a: first model, loads at once, ready at 9.0 (no health poll in Ollama).
        # b: 12e9 > 80 % of min(free 13e9, total - predicted 8e9): unload a. a exits at 30.9,
        # its memory shows free at 31.9, and the 250 ms recovery poll sees it at 32.0: load b,
        # ready at 41.0. a again: the same, from 50.
        assert waits("keepalive-evict", tiny(TRACE)) == pytest.approx([9.0, 11.0, 11.0])

    def test_keepalive_evict_pays_its_readiness_poll(self):
        # Ollama's WaitUntilRunning asks the runner at once, then every 250 ms: a load of
        # 2 s + 7.1 s is seen at 9.25 s, not at 9.1 s (issue 34, third pass).
        from bench.policy.policies.keepalive import seen_at
        assert (seen_at(9.0), seen_at(9.1), seen_at(0.0)) == pytest.approx((9.0, 9.25, 0.0))
        wl = tiny(TRACE[:1], base=int(7.1 * 10**9))
        assert waits("keepalive-evict", wl) == pytest.approx([9.25])

    def test_current_need(self):
        # a arrives before the first read; the read at 0 shows it fits: ready at 9.0. b fits
        # beside a by the read at 29 (13e9 free): ready at 39.0. a is still loaded: 0.
        assert waits("current-need", tiny(TRACE)) == pytest.approx([9.0, 9.0, 0.0])

    @pytest.mark.parametrize("policy", ["berth-scan-declared", "berth-strict-declared"])
    def test_berth_park_and_wake(self, policy):
        # Here a and b load their whole declared 12e9 (14 s), so only one fits the 19e9 that
        # the 1e9 reserve leaves, and the broker's last driver read decides each grant.
        # a: granted at the read at 0, loaded at 14, seen by berth run's own health probe at
        # its next GET, 14.025 (berth.run.probe: 0, 0.05, 0.125, then every 0.1 s; llama-swap's
        # poll passes at once with --front-health, so it adds nothing).
        # b at 30: a has been idle since its request ended at 19.025, and its minimum turn
        # (its 14.025 s cold start, from 14.025) is over at 28.05: b's request is older than any
        # a may get, so a yields at once (issue 34's yardstick: the older request first). The
        # checkpoint takes 12e9 / 70 GB/s = 0.1714 s, the confirmation helper's first poll shows
        # the memory gone, and that read grants b at once: b loads 14 s and the probe sees it at
        # 14.025: a wait of 14.1964. a at 50: b serves its request from 44.1964 to 49.1964,
        # then is idle inside its minimum turn (14.025 s from 44.1964, when the run reported it
        # ready): with no forecast it keeps its card for the demand it may have, up to the rent,
        # until that turn ends at 58.2214. Then b's park (0.1714 s), its confirming read grants
        # a's wake, and the restore takes 12e9 / 8 GB/s = 1.5 s.
        got = waits(policy, tiny(TRACE, base=12 * 10**9))
        park, cold = 12e9 / 70e9, seen_at(14.0)
        assert cold == pytest.approx(14.025)
        b_ready = 30 + park + cold
        assert got == pytest.approx([cold, park + cold, b_ready + cold + park + 1.5 - 50])

    def test_berth_cold_start_pays_the_runs_own_probe(self, monkeypatch):
        """The sim charges a Berth cold start berth run's probe cadence, read from
        berth.run.probe (the module the run's probe sleeps by), not llama-swap's poll: change
        the cadence there and the sim's wait follows."""
        from berth.run import probe
        wl = tiny([(0.0, "a", 5.0, 0, 0.0)], base=12 * 10**9)
        assert waits("berth-default", wl) == pytest.approx([seen_at(14.0)])
        monkeypatch.setattr(probe, "FIRST_S", 0.4)
        monkeypatch.setattr(probe, "CAP_S", 1.0)
        assert seen_at(14.0) == pytest.approx(14.9)
        assert waits("berth-default", wl) == pytest.approx([seen_at(14.0)])

    @pytest.mark.parametrize("policy", ["berth-scan-declared", "berth-strict-declared"])
    def test_busy_holder_keeps_its_turn(self, policy):
        # As above, but b's request at 30 runs 20 s, from 44.1964 to 64.1964: b serves a
        # request older than a's (50), so it keeps its card; then it is idle past its minimum
        # turn (58.2214), and a's request is the older one: the park at once (0.1714 s), then
        # 1.5 s to restore.
        trace = [(0.0, "a", 5.0, 0, 0.0), (30.0, "b", 20.0, 0, 0.0), (50.0, "a", 5.0, 0, 0.0)]
        got = waits(policy, tiny(trace, base=12 * 10**9))
        park = 12e9 / 70e9
        assert got[2] == pytest.approx(30 + park + seen_at(14.0) + 20 + park + 1.5 - 50)


class TestConservation:
    def test_tiny_trace_every_event(self):
        """card used == Σ residency of the engines' processes after every event, and host RAM
        == Σ checkpointed bytes, for every policy (World(check=True) raises otherwise)."""
        wl = tiny(TRACE + [(60.0, "b", 20.0, 4 * 10**9, 3.0), (61.0, "a", 20.0, 4 * 10**9, 3.0)])
        for policy in POLICIES:
            world = World(wl, make(policy), check=True)
            seen = []
            audit = world.loop.after_each

            def after_each(audit=audit, seen=seen, world=world):
                audit()
                seen.append((world.used[P], sum(p.res[P] for p in world.procs)))
            world.loop.after_each = after_each
            world.run()
            assert seen and all(u == s for u, s in seen), policy
            assert all(j.done_s is not None or j.dropped for j in world.jobs), policy

    def test_quick_workload_every_policy(self):
        """The short version CI runs: one workload, a few minutes of it, every policy, with the
        books audited after every event; every request is served, dropped or still open."""
        wl = runner.load_workload(runner.QUICK_WORKLOAD).truncated(runner.QUICK_S)
        for policy in POLICIES:
            world = World(wl, make(policy), check=True)
            rec = world.run()
            s = rec.summary
            assert s["requests"] == len(wl.requests)
            done = sum(1 for j in world.jobs if j.done_s is not None)
            assert done + s["unserved"] + s["dropped"] == len(wl.requests), policy
            assert s["switches"] == sum(s["switches_by_kind"].values())
            assert s["oom_events"] == len(rec.ooms)
            assert s["oom_events"] <= s["switches_by_kind"]["crash"] + len(rec.ooms)
            if policy == DEFAULT:
                # A new install's reserve, not the workload's: 512 MiB of 24 GiB.
                assert s["reserve_fraction"] == pytest.approx(1 / 48, abs=1e-4)
            elif policy.startswith("berth-"):
                assert s["reserve_fraction"] == pytest.approx(1 / 24, abs=1e-4)


class TestOOM:
    TRACE = [(0.0, "a", 20.0, 5 * 10**9, 0.0), (0.5, "b", 20.0, 5 * 10**9, 0.0)]

    def test_current_need_collides(self):
        # Both load (7e9 each fits 20e9). a grows 5e9 at 9.0 (19e9 used once b is loaded at
        # 9.5); b's growth then passes 20e9 on its 4th chunk of 256 MiB: b dies at 9.5.
        world = World(tiny(self.TRACE), make("current-need"), check=True)
        rec = world.run()
        t, pci, engine, used, asked = rec.ooms[0]
        assert (t, pci, engine) == (pytest.approx(9.5), P, "b")
        assert used + asked > 20 * 10**9 >= used
        assert all(j.done_s is not None for j in world.jobs)

    @pytest.mark.parametrize("policy", [p for p in BERTH if p.endswith("declared")] +
                             ["swap", "swap-matrix", "keepalive-evict"])
    def test_declared_sizes_never_collide(self, policy):
        rec = World(tiny(self.TRACE), make(policy), check=True).run()
        assert rec.summary["oom_events"] == 0


class TestPieces:
    def test_confirm_polls(self):
        # berth.driver.base.confirm: at once, then 20 ms doubling up to 50 ms.
        assert next_poll(10.0, 10.0) == 10.0
        assert next_poll(10.0, 10.05) == pytest.approx(10.06)
        assert next_poll(10.0, 10.875) == pytest.approx(10.91)
        assert next_poll(0.0, 100.0) == pytest.approx(100.01)

    def test_the_sims_polls_are_berthds(self, monkeypatch):
        """The sim's Berth reads the driver when berthd's confirmation helper does: confirm()
        on a virtual clock, against a card that shows the event from 1.0 s on, reads at the
        times next_poll gives (a cadence changed in berth.driver.base moves both)."""
        import asyncio
        import types

        from berth.driver import base
        now = [0.0]

        async def sleep(s):
            now[0] += s
        monkeypatch.setattr(base, "asyncio", types.SimpleNamespace(sleep=sleep))
        reads = []

        class Card(base.Driver):
            def cards(self):
                return []

            def read(self, pci):
                reads.append(now[0])
                return base.Reading(pci, now[0], 0, 1, {7: 1} if now[0] < 1.0 else {})
        for cap in (base.CONFIRM_CAP_S, 0.3):
            monkeypatch.setattr(base, "CONFIRM_CAP_S", cap)
            reads.clear()
            now[0] = 0.0
            r = asyncio.run(base.confirm(Card(), P, base.PidsGone(frozenset({7})), 60.0,
                                         clock=lambda: now[0], event_at=0.0))
            assert r is not None and r.at == pytest.approx(next_poll(0.0, 1.0))
            assert all(next_poll(0.0, t) == pytest.approx(t) for t in reads)

    def test_health_poll_and_costs(self):
        m = Mechanisms()
        assert m.load_s(int(23.1e9)) == pytest.approx(14.0)       # seed 002: a reload, 14 s
        assert m.restore_s(int(23.1e9)) == pytest.approx(3.3)     # seed 002: a restore, 3.3 s
        assert m.health_ready_s(9.0) == 9.25 and m.health_ready_s(9.25) == 9.25
        assert m.health_ready_s(0.1) == 0.25

    def test_workload_round_trip(self, tmp_path):
        wl = tiny(TRACE)
        wl.dump(tmp_path / "t.json")
        assert Workload.load(tmp_path / "t.json") == wl

    def test_workload_rejects_nonsense(self):
        with pytest.raises(ValueError, match="unknown engine"):
            tiny([(0.0, "nope", 1.0, 0, 0.0)])
        with pytest.raises(ValueError, match="exceeds"):
            tiny([(0.0, "a", 1.0, 6 * 10**9, 0.0)])

    def test_generator_reproduces_committed_files(self):
        from bench.policy.gen import build_every
        built = build_every(None)
        assert set(built) == set(runner.WORKLOADS)
        for name, wl in built.items():
            committed = runner.load_workload(name)
            assert len(committed.requests) == len(wl.requests)
            assert committed.engines == wl.engines and committed.clients == wl.clients
            assert all(math.isclose(a.t_s, b.t_s, abs_tol=1e-3) and a.growth_bytes == b.growth_bytes
                       for a, b in zip(committed.requests, wl.requests, strict=True))

    def test_llama_swap_groups_and_matrix(self):
        b = runner.load_workload("b-four-cards")
        groups = card_components(b.engines)
        assert groups["coder-14"] == groups["embed-1.5"] != groups["big-60"] == groups["vision-10"]
        sets = fitting_sets(b)
        assert any({"coder-14", "chat-8", "embed-1.5"} <= s for s in sets)
        assert not any({"big-60", "comfy"} <= s for s in sets)


def test_cli_quick_json(capsys):
    """``run.py --quick --json``: the last line is one JSON object keyed workload/policy."""
    assert runner.main(["--quick", "--json", "--no-plots"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("commit: ")
    last = json.loads(out[-1])
    for policy in POLICIES:
        v = last[f"{runner.QUICK_WORKLOAD}/{policy}"]
        assert {"p95_wait_s", "oom_events", "switches"} <= set(v)
    assert {"holds", "ratio_to_best_peer", "ratio_to_ideal", "engines"} <= set(
        last[f"{runner.QUICK_WORKLOAD}/{DEFAULT}"]["verdict"])


class TestDefault:
    def test_default_is_a_new_install(self):
        """berth-default carries berth.toml's defaults, not the bench's tuned knobs."""
        from berth.config.models import CardConfig, PolicyConfig
        pol = make(DEFAULT)
        assert pol.knobs["release_grace_s"] == PolicyConfig().release_grace == DEFAULT_KNOBS[
            "release_grace_s"]
        assert pol.reserve_bytes == CardConfig().reserve and pol.max_in_flight == "slots"
        assert str(pol.queue) == str(PolicyConfig().queue) and str(pol.bound) == "declared"

    def test_verdict_figures(self):
        def run(p95, by_engine, longest, answered, oom=0):
            return {"oom_events": oom, "p95_wait_s": p95, "p95_wait_by_engine_s": by_engine,
                    "max_wait_s": longest, "answered": answered}
        runs = {"w/swap": run(10.0, {"a": 4.0, "b": 10.0}, 12.0, 100),
                "w/swap-matrix": run(2.0, {"a": 1.0, "b": 2.0}, 3.0, 100, oom=1),
                "w/keepalive-evict": run(8.0, {"a": 3.0, "b": 8.0}, 9.0, 100),
                "w/ideal": run(2.0, {}, 2.0, 100),
                f"w/{DEFAULT}": run(6.0, {"a": 3.5, "b": 6.0}, 9.9, 98)}
        v = verdict(runs, "w")
        # swap-matrix had an OOM, so the best zero-OOM peer is keepalive-evict; a's 3.5 s is
        # within 1.1 x 3 s? No: 3.3 s is the most it may be.
        assert (v["best_peer"], v["ratio_to_best_peer"], v["ratio_to_ideal"]) == (
            "keepalive-evict", 0.75, 3.0)
        assert v["engines"]["a"] == {"p95_wait_s": 3.5, "peer_p95_wait_s": 3.0, "ratio": 1.167,
                                     "holds": False}
        assert v["tests"] == {"p95": True, "engines": False, "longest": True, "answered": True}
        assert v["holds"] is False
        runs[f"w/{DEFAULT}"]["p95_wait_by_engine_s"]["a"] = 3.3      # 1.1 x 3 s: holds
        assert verdict(runs, "w")["holds"] is True
        runs[f"w/{DEFAULT}"]["max_wait_s"] = 10.0                    # past 1.1 x 9 s = 9.9
        assert verdict(runs, "w")["tests"]["longest"] is False
        runs[f"w/{DEFAULT}"].update(max_wait_s=9.0, answered=97)     # under 0.98 x 100
        assert verdict(runs, "w")["tests"]["answered"] is False
        runs[f"w/{DEFAULT}"].update(answered=98, p95_wait_s=8.5)     # above the peer's 8 s
        assert verdict(runs, "w")["tests"]["p95"] is False
        runs[f"w/{DEFAULT}"].update(p95_wait_s=6.0, oom_events=1)    # all four, but an OOM
        v = verdict(runs, "w")
        assert all(v["tests"].values()) and v["holds"] is False


def test_default_on_another_seed_short(capsys):
    """The short form of gen.py seed 2 (its one-card workload, first 10 minutes), replayed by
    ``run.py --seed 2 --quick``: berth-default has zero OOM, and its verdict against the peers is
    computed there too (whether it holds is reported, not asserted: see bench/policy/README.md)."""
    pols = ["swap", "swap-matrix", "keepalive-evict", DEFAULT]
    argv = ["--seed", "2", "--quick", "--json", "--no-plots"]
    for p in pols:
        argv += ["--policy", p]
    assert runner.main(argv) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    d = last[f"{runner.QUICK_WORKLOAD}/{DEFAULT}"]
    assert d["oom_events"] == 0 and d["unserved"] + d["dropped"] == 0
    v = d["verdict"]
    assert v["best_peer"] in pols[:3] and set(v["engines"]) == {"chat-14", "chat-8", "comfy"}


class TestIssue24Machinery:
    """Closed-loop clients, clients that leave, and the shapes built on them (issue 24)."""

    def test_every_shape_under_every_policy_keeps_the_books(self):
        from bench.policy.shapes import ISSUE_24, build_shapes
        for name, wl in build_shapes().items():
            # Issue 34's shapes: the peers and the default (the six configurations share the
            # default's code paths; every one of them runs issue 24's shapes).
            for policy in POLICIES if name in ISSUE_24 else ("swap", "swap-matrix",
                                                             "keepalive-evict", DEFAULT):
                world = World(wl, make(policy), check=True)
                s = world.run().summary
                assert s["requests"] == len(world.jobs), (name, policy)
                assert all(j.done_s is not None or j.dropped or j.answered_s is None
                           for j in world.jobs), (name, policy)

    def test_a_closed_loop_client_sends_after_each_answer_and_its_pause(self):
        # current-need loads a at once (ready at 9.0): the first request waits 9 s, runs to
        # 14, the client pauses 1 s; then 15-20, 21-26, 27-32; at 33 it is past until_s (30).
        from bench.policy.workload import ClientSpec
        wl = replace(tiny([]), clients=(ClientSpec("a", 0.0, 30.0, 1.0, 5.0),)).validate()
        world = World(wl, make("current-need"), check=True)
        world.run()
        assert [j.arrival_s for j in world.jobs] == pytest.approx([0.0, 15.0, 21.0, 27.0])
        assert [j.wait_s for j in world.jobs] == pytest.approx([9.0, 0.0, 0.0, 0.0])

    def test_a_client_that_leaves_counts_its_wait_until_it_left(self):
        # a loads for 9 s; b's request gives up after 3 s, before anything could serve it.
        wl = tiny([(0.0, "a", 5.0, 0, 0.0), (1.0, "b", 5.0, 0, 0.0, "chat", 3.0)])
        for policy in POLICIES:
            world = World(wl, make(policy), check=True)
            s = world.run().summary
            b = world.jobs[1]
            assert b.dropped == "client left" and b.answered_s == pytest.approx(4.0), policy
            assert s["left"] == 1 and s["answered"] == 1, policy


def test_plots_without_matplotlib_say_how_to_get_it(monkeypatch):
    """matplotlib is the ``bench`` extra, not a test dependency (issue 38): asked for plots
    without it, run.py says what to install before it replays anything, and no test draws."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # `import matplotlib` fails
    with pytest.raises(SystemExit) as e:
        runner.main(["--quick"])
    assert "pip install -e '.[bench]'" in str(e.value) and "--no-plots" in str(e.value)


def three(requests, priority=(0, 0, 0)) -> Workload:
    """One 20e9 card, engines ``a``, ``b``, ``c`` of 12e9 declared and 7e9 loaded: one at a
    time under llama-swap's group."""
    engines = tuple(EngineSpec(name=n, size_bytes={P: 12 * 10**9}, base_bytes={P: 7 * 10**9},
                               slots=2, priority=pr) for n, pr in zip("abc", priority, strict=True))
    return replace(tiny([]), engines=engines,
                   requests=tuple(RequestSpec(*r) for r in requests)).validate()


class TestIssue34Yardstick:
    """Clients that move between engines, the peers as their current source behaves, the
    seeded shapes and the table of cells held (issue 34)."""

    def test_a_client_alternating_two_engines_sends_after_each_answer(self):
        # swap, one at a time. a: load 9 s, seen at the poll at 9.25; it runs to 14.25, the
        # client thinks 1 s and asks b at 15.25: a stops (exits at 16.15), b loads, seen at
        # 16.15 + 9.25 = 25.4 (waited 10.15), runs to 30.4; a at 31.4, the same swap back;
        # b at 47.55; the next would leave at 63.7, past until_s (60).
        from bench.policy.workload import ClientSpec
        c = ClientSpec("a", 0.0, 60.0, 1.0, 5.0, engines=("a", "b"))
        wl = replace(tiny([]), clients=(c,)).validate()
        world = World(wl, make("swap"), check=True)
        world.run()
        assert [j.engine for j in world.jobs] == ["a", "b", "a", "b"]
        assert [j.arrival_s for j in world.jobs] == pytest.approx([0.0, 15.25, 31.4, 47.55])
        assert [j.wait_s for j in world.jobs] == pytest.approx([9.25, 10.15, 10.15, 10.15])
        assert {j.client for j in world.jobs} == {0}

    def test_a_random_client_draws_the_same_steps_under_every_policy(self):
        from bench.policy.workload import ClientSpec
        c = ClientSpec("a", 0.0, 1e9, 0.0, 1.0, engines=("a", "b"), weights=(3.0, 1.0),
                       pause_max_s=30.0, service_max_s=2.0, seed=5)
        first = list(itertools.islice(c.steps(), 400))
        assert first == list(itertools.islice(c.steps(), 400))
        assert 240 < sum(1 for e, _, _ in first if e == "a") < 360      # weights 3:1
        assert all(0.0 <= t <= 30.0 and 1.0 <= s <= 2.0 for _, s, t in first)
        wl = replace(tiny([]), duration_s=300.0,
                     clients=(replace(c, until_s=300.0),)).validate()
        seen = {}
        for policy in ("swap", "keepalive-evict", DEFAULT):
            world = World(wl, make(policy), check=True)
            world.run()
            seen[policy] = [(j.engine, j.spec.service_s) for j in world.jobs]
        n = min(len(v) for v in seen.values())
        assert n > 3 and len({tuple(v[:n]) for v in seen.values()}) == 1, seen

    def test_a_bursty_client_thinks_only_after_each_burst(self):
        from bench.policy.workload import ClientSpec
        c = ClientSpec("a", 0.0, 60.0, 10.0, 1.0, burst=3, burst_gap_s=0.5)
        thinks = [t for _, _, t in itertools.islice(c.steps(), 7)]
        assert thinks == [0.5, 0.5, 10.0, 0.5, 0.5, 10.0, 0.5]
        # current-need: a loads at once (ready at 9.0); requests at 0, 10.5, 12 (the burst's
        # gaps), then 23 after 10 s of reading, 24.5, 26; the next would leave at 37 > 30.
        wl = replace(tiny([]), clients=(replace(c, until_s=30.0),)).validate()
        world = World(wl, make("current-need"), check=True)
        world.run()
        assert [j.arrival_s for j in world.jobs] == pytest.approx([0.0, 10.5, 12.0, 23.0, 24.5,
                                                                   26.0])

    def test_a_client_file_round_trips_and_bad_weights_are_named(self, tmp_path):
        from bench.policy.workload import ClientSpec
        c = ClientSpec("a", 0.0, 60.0, 0.5, 1.0, engines=("a", "b"), weights=(1, 2),
                       pause_max_s=4.0, seed=3)
        wl = replace(tiny([]), clients=(c,)).validate()
        wl.dump(tmp_path / "w.json")
        assert Workload.load(tmp_path / "w.json").clients == (c,)
        with pytest.raises(ValueError, match=r"clients\[0\]: weights"):
            replace(wl, clients=(replace(c, weights=(1.0,)),)).validate()
        with pytest.raises(ValueError, match="unknown engine 'z'"):
            replace(wl, clients=(replace(c, engines=("a", "z"), weights=()),)).validate()

    def test_llama_swap_collates_requests_for_the_same_model(self):
        # a b c a b c, a second apart, 5 s each (fifo.go: "A B C A B C --> A A B B C C").
        # a swaps in (seen at 9.25); b and c collide with that swap and queue; the second a
        # joins it. When both a's end (14.25) the re-walk starts b's swap (a exits at 15.15,
        # b seen at 24.4) and the second b joins it; c likewise (b exits at 30.3, c at 39.55).
        wl = three([(t, e, 5.0, 0, 0.0) for t, e in enumerate("abcabc")])
        world = World(wl, make("swap"), check=True)
        world.run()
        order = [j.engine for j in sorted(world.jobs, key=lambda j: (j.start_s, j.id))]
        assert order == list("aabbcc")
        assert [j.wait_s for j in world.jobs] == pytest.approx(
            [9.25, 23.4, 37.55, 6.25, 20.4, 34.55])

    def test_llama_swap_serves_its_queue_by_priority(self):
        # fifo.priority: c (5) queued after b (0) is served before it. a runs 9.25-29.25; then
        # c swaps in (a exits at 30.15, c seen at 39.4) and b after c (c exits at 45.3).
        wl = three([(0.0, "a", 20.0, 0, 0.0), (1.0, "b", 5.0, 0, 0.0), (2.0, "c", 5.0, 0, 0.0)],
                   priority=(0, 0, 5))
        assert waits("swap", wl) == pytest.approx([9.25, 53.55, 37.4])
        flat = replace(wl, engines=tuple(replace(e, priority=0) for e in wl.engines))
        # Without priorities the queue keeps arrival order: b at 39.4, c at 54.55.
        assert waits("swap", flat) == pytest.approx([9.25, 38.4, 52.55])

    def test_ollama_loads_on_the_best_single_card_that_fits(self):
        # Two 20e9 cards; a (12e9 estimate) loads first on gpu0 (a tie: card order). b asks at
        # 30: on gpu0 only min(13e9 free, 20e9 - 12e9) = 8e9 is free, 12e9 > 80 % of it; gpu1
        # has 20e9: b loads there at once (9 s, no health poll), nothing is unloaded.
        p1 = "0000:02:00.0"
        cards = (CardSpec(P, "gpu0", 20 * 10**9, 0), CardSpec(p1, "gpu1", 20 * 10**9, 0))
        engines = tuple(EngineSpec(name=n, size_bytes={P: 12 * 10**9}, base_bytes={P: 7 * 10**9},
                                   slots=2, free=True) for n in "ab")
        wl = replace(tiny([(0.0, "a", 60.0, 0, 0.0), (30.0, "b", 5.0, 0, 0.0)]), cards=cards,
                     engines=engines).validate()
        world = World(wl, make("keepalive-evict"), check=True)
        s = world.run().summary
        assert [j.wait_s for j in world.jobs] == pytest.approx([9.0, 9.0])
        assert {e: dict(c) for e, c in s["cards_by_engine"].items()} == {
            "a": {"gpu0": 1}, "b": {"gpu1": 1}}
        assert s["switches_by_kind"]["drain"] == 0
        fixed = replace(wl, engines=tuple(replace(e, free=False) for e in engines))
        assert World(fixed, make("keepalive-evict")).run().summary[
            "switches_by_kind"]["drain"] == 1             # its own card: a is unloaded

    def test_every_seed_draws_every_workload_anew(self):
        from bench.policy.gen import build_every
        one, two = build_every(1), build_every(2)
        assert set(one) == set(runner.WORKLOADS)
        for name in runner.WORKLOADS:
            assert (one[name].requests, one[name].clients) != (
                two[name].requests, two[name].clients), name

    def test_verdict_compares_the_requests_both_runs_made(self):
        # A closed-loop client's n-th request is the same under every policy: the default got
        # to its 5th..24th (answered at once), the peer never made them. Over every request
        # the default's p95 is 0 s, thanks to those twenty alone; over the four both made it
        # is 0.85 x 9.5 s against the peer's 0.85 x 9 s (issue 34, third pass).
        def run(waits, oom=0):
            by_engine: dict[str, list[float]] = {}
            for e, w in waits.values():
                by_engine.setdefault(e, []).append(w)
            import numpy as np
            p95 = float(np.percentile(sorted(w for _, w in waits.values()), 95))
            return {"oom_events": oom, "p95_wait_s": p95, "max_wait_s": max(
                w for _, w in waits.values()), "answered": len(waits),
                "p95_wait_by_engine_s": {e: float(np.percentile(w, 95))
                                         for e, w in by_engine.items()},
                "request_waits": {k: [e, w] for k, (e, w) in waits.items()}}
        peer = {f"c0.{n}": ("ab"[n % 2], 9.0 if n == 0 else 0.0) for n in range(4)}
        mine = {f"c0.{n}": ("ab"[n % 2], 9.5 if n == 0 else 0.0) for n in range(24)}
        runs = {"w/swap": run(peer), f"w/{DEFAULT}": run(mine)}
        runs["w/swap"]["answered"] = 24         # the answered test is not the one in question
        assert runs[f"w/{DEFAULT}"]["p95_wait_s"] == 0.0
        assert runs["w/swap"]["p95_wait_s"] == pytest.approx(7.65)
        v = verdict(runs, "w")
        assert (v["paired_p95_wait_s"], v["peer_paired_p95_wait_s"]) == pytest.approx(
            (8.075, 7.65))
        assert v["ratio_to_best_peer"] == pytest.approx(1.056, abs=1e-3)
        assert v["tests"]["p95"] is False and v["engines"]["a"]["holds"] is True
        # Summaries without the names (older JSON) compare every request, as before.
        for r in runs.values():
            del r["request_waits"]
        assert verdict(runs, "w")["tests"]["p95"] is True

    def test_the_table_over_seeds(self):
        from bench.policy import yardstick
        assert yardstick.parse_seeds("1-3,7") == [1, 2, 3, 7]
        with pytest.raises(ValueError, match="--seeds"):
            yardstick.parse_seeds("one")
        m = yardstick.measure([1], ["j-alternate-two"])
        cell = m["cells"]["j-alternate-two"][1]
        best = m["hindsight"]["j-alternate-two"][1]
        assert set(cell) >= {"holds", "ratio", "failed"} and best["rent_s"] in yardstick.RENT_GRID
        # Chosen after the fact: no rent of the grid holds where the pick does not, and none
        # that holds has a lower p95.
        runs = {f"j/{p}": s for p, s in _peer_runs(1).items()}
        for rent in yardstick.RENT_GRID:
            runs["j/x"] = World(build_every_one(1), make(DEFAULT, {"rent_fixed_s": rent})).run(
            ).summary
            v = verdict(runs, "j", policy="x")
            assert (v["holds"], -v["p95_wait_s"]) <= (best["holds"], -best["p95_wait_s"]), rent
        text = yardstick.table(m, [1])
        assert "| j-alternate-two |" in text and "best fixed rent" in text

    def test_a_turn_fits_a_long_job_and_the_holders_next_request(self):
        """The default ``max_turn`` (60 s) lets a holder that serves jobs of 30-45 s back to back
        finish one and start its client's next before an equal-priority waiter takes the card.
        At 30 s every such job ended the turn: on h (a waiter whose client leaves) A was parked
        for a client already gone and its next requests waited for the wake, so h held on 2 of
        seeds 1..10 (A's p95 1.5-4.1 s against llama-swap's 1.0 s); it holds on all ten now,
        and on 20 held-out seeds (bench/policy/README.md, "Issue 34, fifth pass")."""
        from bench.policy import yardstick
        assert DEFAULT_KNOBS["max_turn_s"] == 60.0
        m = yardstick.measure([1, 3, 4], ["h-client-leaves"], hindsight=False)
        cells = m["cells"]["h-client-leaves"]
        assert all(c["holds"] for c in cells.values()), cells


def build_every_one(seed: int) -> Workload:
    from bench.policy.gen import build_every
    return build_every(seed)["j-alternate-two"]


def _peer_runs(seed: int) -> dict:
    from bench.policy.policies import PEERS
    return {p: World(build_every_one(seed), make(p)).run().summary for p in PEERS}
