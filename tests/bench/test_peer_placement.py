"""How the peers that place put engines of ``free`` placement on cards (issue 25: "Policies
that place (Berth, swap-matrix's sets, current-need) get free placement"). Virtual time, no
sleeps; each case is small enough to work out by hand.
"""

from __future__ import annotations

from bench.policy.policies import make
from bench.policy.workload import CardSpec, EngineSpec, Mechanisms, RequestSpec, Workload
from bench.policy.world import World

G0, G1, G2 = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"
MECH = Mechanisms(restore_gbps=8.0, checkpoint_gbps=70.0, reload_gbps=1.0, init_s=2.0,
                  drain_s=0.9, free_lag_s=1.0)


def two_cards(requests, engines, cards=(G0, G1)) -> Workload:
    return Workload(name="place", description="hand-computed", seed=0, duration_s=100.0,
                    host_ram_bytes=64 * 10**9,
                    cards=tuple(CardSpec(p, f"gpu{i}", 20 * 10**9, 0)
                                for i, p in enumerate(cards)),
                    engines=engines, requests=tuple(RequestSpec(*r) for r in requests),
                    mechanisms=MECH).validate()


def engine(name: str, cards: tuple[str, ...], size: int, base: int, free: bool = True):
    return EngineSpec(name=name, size_bytes={p: size for p in cards},
                      base_bytes={p: base for p in cards}, slots=2, free=free)


def run(policy: str, wl: Workload) -> dict:
    world = World(wl, make(policy), check=True)
    s = world.run().summary
    s["cards_by_engine"] = {e: c for e, c in s["cards_by_engine"].items() if c}
    return s


# a (12e9 declared, 7e9 loaded) runs on gpu0 from 0 to 60; b, of the same size and also
# written on gpu0, asks at 30. Both fit only on cards of their own.
BUSY = [(0.0, "a", 60.0, 0, 0.0), (30.0, "b", 5.0, 0, 0.0)]


class TestSwapMatrix_FreePlacement:
    def test_the_matrix_picks_the_variant_that_evicts_nothing(self):
        wl = two_cards(BUSY, (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                              engine("b", (G0,), 12 * 10**9, 7 * 10**9)))
        s = run("swap-matrix", wl)
        assert s["cards_by_engine"] == {"a": {"gpu0": 1}, "b": {"gpu1": 1}}
        assert s["switches_by_kind"].get("drain", 0) == 0
        # b loads at once on gpu1: 2 s + 7 s, seen at the next health poll (0.25 s, then 1 s).
        assert s["max_wait_s"] < 10.0

    def test_own_cards_first_when_they_evict_as_few(self):
        # gpu1 is as free as gpu0: the tie goes to the engine's own card (definition order).
        wl = two_cards([(0.0, "b", 5.0, 0, 0.0)],
                       (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                        engine("b", (G1,), 12 * 10**9, 7 * 10**9)))
        assert run("swap-matrix", wl)["cards_by_engine"] == {"b": {"gpu1": 1}}

    def test_a_multi_card_engine_takes_the_pair_that_keeps_the_running_model(self):
        wl = two_cards([(0.0, "a", 60.0, 0, 0.0), (30.0, "big", 5.0, 0, 0.0)],
                       (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                        engine("big", (G0, G1), 15 * 10**9, 10 * 10**9)),
                       cards=(G0, G1, G2))
        s = run("swap-matrix", wl)
        assert s["cards_by_engine"]["big"] == {"gpu1+gpu2": 1}
        assert s["switches_by_kind"].get("drain", 0) == 0

    def test_swap_groups_keep_their_own_cards(self):
        wl = two_cards(BUSY, (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                              engine("b", (G0,), 12 * 10**9, 7 * 10**9)))
        assert run("swap", wl)["cards_by_engine"] == {"a": {"gpu0": 1}, "b": {"gpu0": 1}}


class TestCurrentNeed_FreePlacement:
    def test_an_engine_goes_where_its_load_is_free(self):
        wl = two_cards(BUSY, (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                              engine("b", (G0,), 16 * 10**9, 15 * 10**9)))
        s = run("current-need", wl)
        assert s["cards_by_engine"] == {"a": {"gpu0": 1}, "b": {"gpu1": 1}}
        assert s["switches_by_kind"].get("drain", 0) == 0

    def test_the_most_free_card_first(self):
        # a holds 7e9 of gpu0; b (3e9 loaded) fits on both and goes where more stays free.
        wl = two_cards(BUSY, (engine("a", (G0,), 12 * 10**9, 7 * 10**9),
                              engine("b", (G0,), 4 * 10**9, 3 * 10**9)))
        assert run("current-need", wl)["cards_by_engine"]["b"] == {"gpu1": 1}

    def test_fixed_engines_stay_on_their_cards(self):
        wl = two_cards(BUSY, (engine("a", (G0,), 12 * 10**9, 7 * 10**9, free=False),
                              engine("b", (G0,), 16 * 10**9, 15 * 10**9, free=False)))
        assert run("current-need", wl)["cards_by_engine"] == {"a": {"gpu0": 1},
                                                              "b": {"gpu0": 1}}
