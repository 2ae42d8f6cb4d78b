"""berth.toml: the example validates; bad configs list every error by key path and value."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from berth.config import ConfigError, load, parse

from tests.berthd import BERTH

EXAMPLE = Path(__file__).resolve().parents[2] / "core" / "examples" / "berth.toml"


def test_the_commented_example_config_validates():
    cfg = load(EXAMPLE)
    assert cfg.driver.kind == "sim" and len(cfg.driver.cards) == 2
    assert cfg.card_config("0000:01:00.0", "gpu0").claims == {"desktop": 1 << 30}
    out = subprocess.run([BERTH, "config", "check", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0 and "valid" in out.stdout and "qwen-14b" in out.stdout


def test_every_error_is_listed_with_its_key_and_value():
    with pytest.raises(ConfigError) as e:
        parse({"driver": {"kind": "sim", "cards": [{"pci": "nope", "name": "g", "total": "x"}]},
               "policy": {"release_grace": "soon", "queue": "fifo"},
               "engines": {"c": {"park": "checkpoint"}, "d": {"park": "hook"}}})
    keys = [k for k, _ in e.value.problems]
    assert keys == ["driver.cards.0.pci", "driver.cards.0.total", "policy.queue",
                    "policy.release_grace", "engines.c", "engines.d"]
    text = str(e.value)
    assert "'nope'" in text and "'soon'" in text and "front" in text


def test_a_missing_or_malformed_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[driver\nkind=")
    with pytest.raises(ConfigError, match=r"\(toml\)"):
        load(bad)


def test_card_entries_must_name_a_declared_sim_card():
    with pytest.raises(ConfigError, match="cards.gpu7"):
        parse({"driver": {"kind": "sim", "cards": [{"pci": "0000:01:00.0", "name": "gpu0",
                                                     "total": "8GiB"}]},
               "cards": {"gpu7": {"reserve": "1GiB"}}})


def test_tcp_api_needs_a_key():
    with pytest.raises(ConfigError, match="api"):
        parse({"api": {"tcp": "127.0.0.1:7878"}})


# -- values the tester found accepted (each must name its key path and its value) -------------
SIM = {"kind": "sim", "cards": [{"pci": "0000:01:00.0", "name": "gpu0", "total": "24GiB"},
                                {"pci": "0000:02:00.0", "name": "gpu1", "total": "12GiB"}]}


def _problems(doc: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        parse(doc)
    return dict(e.value.problems)


def _one(doc: dict, key: str, *words: str) -> str:
    """``doc`` is refused with exactly one problem, at ``key``, whose message has ``words``."""
    probs = _problems(doc)
    assert list(probs) == [key], probs
    for w in words:
        assert w in probs[key], probs
    return probs[key]


def test_an_engine_card_must_be_a_declared_sim_card():
    _one({"driver": SIM, "engines": {"e": {"size": "1GiB", "card": "gpu9"}}},
         "engines.e.card", "'gpu9'", "gpu0 (0000:01:00.0)")
    cfg = parse({"driver": SIM, "engines": {"a": {"card": "gpu1", "size": "1GiB"},
                                            "b": {"card": "02:00.0", "size": "1GiB"}}})
    assert cfg.engines["b"].card == "0000:02:00.0"      # as berthd keys its cards
    # A card shown under another name ([cards.X] name) is found by that name only, as berthd does.
    msg = _one({"driver": SIM, "cards": {"gpu1": {"name": "small"}},
                "engines": {"e": {"size": "1GiB", "card": "gpu1"}}}, "engines.e.card", "'small'")
    assert "'gpu1'" in msg
    parse({"driver": SIM, "cards": {"gpu1": {"name": "small"}},
           "engines": {"e": {"size": "1GiB", "card": "small"}}})


def test_an_engine_size_must_be_more_than_zero():
    _one({"engines": {"e": {"size": "0GiB"}}}, "engines.e.size", "'0GiB'", "more than 0")


def test_a_sim_engine_size_must_fit_its_card_or_some_card():
    _one({"driver": SIM, "engines": {"e": {"size": "13GiB", "card": "gpu1"}}},
         "engines.e.size", "'13GiB'", "gpu1", "11.5GiB")
    _one({"driver": SIM, "engines": {"e": {"size": "30GiB"}}},
         "engines.e.size", "'30GiB'", "any simulated card", "gpu0", "23.5GiB")
    _one({"driver": SIM, "engines": {"e": {"size": "card", "card": "gpu1", "need": "20GiB"}}},
         "engines.e.need", "'20GiB'", "gpu1")
    parse({"driver": SIM, "engines": {"e": {"size": "23GiB"}, "f": {"size": "card"}}})


def test_a_reserve_of_the_whole_card_is_refused():
    _one({"driver": SIM, "cards": {"gpu1": {"reserve": "12GiB"}}},
         "cards.gpu1.reserve", "12.0GiB", "whole card")
    # No [cards.X] entry: the default reserve (512 MiB) on a 256 MiB card.
    _one({"driver": {"kind": "sim", "cards": [{"pci": "01:00.0", "name": "g", "total": "256MiB"}]}},
         "driver.cards.0.total", "512.0MiB", "256.0MiB")


def test_reserve_claims_and_baseline_must_leave_memory_to_grant():
    _one({"driver": SIM, "cards": {"gpu1": {"reserve": "4GiB", "claims": {"game": "4GiB"},
                                            "baseline": "4GiB"}}},
         "cards.gpu1", "no memory would be left to grant", "12.0GiB total", "4.0GiB reserve")


def test_claims_and_baselines_larger_than_the_card_are_refused():
    probs = _problems({"driver": SIM, "cards": {"gpu0": {"claims": {"game": "30GiB"},
                                                         "baseline": "30GiB"}}})
    assert set(probs) == {"cards.gpu0.claims.game", "cards.gpu0.baseline"}, probs
    assert all("30.0GiB" in m and "24.0GiB" in m for m in probs.values())
    sim = {"kind": "sim", "cards": [{"pci": "01:00.0", "name": "g", "total": "8GiB",
                                     "baseline": "9GiB"}]}
    _one({"driver": sim}, "driver.cards.0.baseline", "9.0GiB", "8.0GiB")


def test_a_card_total_of_nothing_or_more_than_a_pebibyte_is_refused():
    probs = _problems({"driver": {"kind": "sim", "cards": [
        {"pci": "01:00.0", "name": "a", "total": "0B"},
        {"pci": "02:00.0", "name": "b", "total": "2000TiB"}]}})
    assert set(probs) == {"driver.cards.0.total", "driver.cards.1.total"}, probs
    assert "'0B'" in probs["driver.cards.0.total"]
    assert "'2000TiB'" in probs["driver.cards.1.total"] and "1 PiB" in probs["driver.cards.1.total"]


def test_checkpoint_rate_must_be_positive_and_free_delay_not_negative():
    _one({"driver": {"checkpoint_rate": "0GB"}}, "driver.checkpoint_rate", "'0GB'", "more than 0")
    _one({"driver": {"free_delay": "-1s"}}, "driver.free_delay", "'-1s'", "negative")
    _one({"driver": {"free_delay": -1}}, "driver.free_delay", "-1", "negative")



@pytest.mark.parametrize("rate", [7_000_000_000, "7000000000"])
def test_a_checkpoint_rate_without_a_unit_is_bytes_per_second(rate):
    """A rate is bytes per second (the default is written 7_000_000_000): the rule that a size
    carries its unit refused it, naming '7000000000GiB' as the fix."""
    assert parse({"driver": {"checkpoint_rate": rate}}).driver.checkpoint_rate == 7_000_000_000

@pytest.mark.parametrize("tcp", ["nope", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000",
                                 "host:port", ""])
def test_api_tcp_must_be_host_and_port(tcp):
    _one({"api": {"tcp": tcp, "key": "k" * 16}}, "api.tcp", repr(tcp), "HOST:PORT", "65535")


def test_api_tcp_accepts_host_and_port():
    assert parse({"api": {"tcp": "127.0.0.1:7878", "key": "k" * 16}}).api.tcp == "127.0.0.1:7878"


def test_an_engine_need_must_not_exceed_its_size():
    _one({"engines": {"e": {"size": "8GiB", "need": "9GiB"}}}, "engines.e.need", "'9GiB'", "'8GiB'")


def test_lend_max_without_lend_is_refused_naming_the_key(tmp_path):
    """``lend_max`` on an entry that does not lend was taken and meant nothing (the missing
    ``lend = true`` went unnoticed): refused at its key, with the value and how to fix it."""
    for entry in ({"size": "4GiB", "lend_max": "2GiB"},
                  {"size": "4GiB", "front": "127.0.0.1:1", "lend": False, "lend_max": "2GiB"}):
        _one({"engines": {"e": entry}}, "engines.e.lend_max", "'2GiB'", "lend = true")
    parse({"engines": {"e": {"front": "127.0.0.1:1", "lend": True, "lend_max": "2GiB"}}})
    f = tmp_path / "berth.toml"
    f.write_text('[engines.e]\nsize = "4GiB"\nlend_max = "2GiB"\n')
    out = subprocess.run([BERTH, "config", "check", str(f)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "engines.e.lend_max" in out.stderr, out
    assert "'2GiB'" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("bad", [True, 1.5, "3"])
def test_priority_is_a_whole_number_not_a_boolean(bad):
    _one({"engines": {"e": {"priority": bad}}}, "engines.e.priority", repr(bad), "whole number")
    _one({"policy": {"juggle_max_swaps": bad}}, "policy.juggle_max_swaps", repr(bad))


def test_read_interval_of_zero_is_refused_saying_why():
    _one({"policy": {"read_interval": "0s"}}, "policy.read_interval", "'0s'", "50ms", "CPU")
    _one({"policy": {"read_interval": "10ms"}}, "policy.read_interval", "'10ms'")
    assert parse({"policy": {"read_interval": "50ms"}}).policy.read_interval == 0.05


@pytest.mark.parametrize("key", ["release_grace", "wake_limit", "wait_limit"])
def test_limits_must_be_more_than_zero(key):
    _one({"policy": {key: "0s"}}, f"policy.{key}", "'0s'", "more than 0")


def test_min_turn_and_juggle_window_may_be_zero_not_negative():
    p = parse({"policy": {"min_turn": "0s", "juggle_window": "0s"}}).policy
    assert p.min_turn == 0 and p.juggle_window == 0
    probs = _problems({"policy": {"min_turn": "-1s", "juggle_window": -5}})
    assert set(probs) == {"policy.min_turn", "policy.juggle_window"}
    assert all("negative" in m for m in probs.values())


def test_a_dotted_engine_name_says_to_quote_it(tmp_path):
    f = tmp_path / "berth.toml"
    f.write_text('[engines.qwen2.5-coder-14b]\nsize = "8GiB"\n')
    with pytest.raises(ConfigError) as e:
        load(f)
    ((key, msg),) = e.value.problems
    assert key == 'engines."qwen2.5-coder-14b"'
    assert '[engines."qwen2.5-coder-14b"]' in msg and "quote" in msg


def test_an_engine_name_berthd_would_refuse_is_refused_here():
    # berthd refuses a lease for a name with a space (the board's XSS test spells one), so a
    # run of such an entry could never be granted; the config said nothing.
    name = "<img src=x onerror=alert(1)>"
    _one({"engines": {name: {"size": "1GiB"}}}, f'engines."{name}"', repr(name), "no spaces")
    assert list(parse({"engines": {"<img/src=x>": {}}}).engines) == ["<img/src=x>"]


def test_an_unknown_key_is_named_with_the_allowed_keys():
    msg = _one({"engines": {"e": {"sise": "8GiB"}}}, "engines.e.sise", "unknown key", "'size'")
    assert "growth_allowance" in msg and "Extra inputs" not in msg
    # A misspelled key's value is not repeated: it may be a secret under the wrong name (issue
    # 36); a known key in the wrong table still shows it (test_a_key_in_the_wrong_table...).
    assert "8GiB" not in msg
    _one({"engine": {"e": {}}}, "engine", "unknown key", "'engines'")


def test_each_problem_names_its_key_once():
    # The value checks label what they read ("ram_budget: ...", "size: ..."): after the key
    # path the message said the field twice, e.g. "policy.ram_budget: ram_budget: '5' ...".
    probs = _problems({"driver": {**SIM, "checkpoint_rate": "0", "free_delay": "x"},
                       "cards": {"gpu0": {"reserve": "zz"}},
                       "policy": {"ram_budget": "5", "read_interval": "1ms", "min_turn": -1},
                       "engines": {"e": {"size": "8GiB", "need": "3"}}})
    assert probs == {
        "driver.checkpoint_rate": "must be more than 0 bytes per second, got '0'",
        "driver.free_delay": "expected a duration like '20s', '500ms', '2m' or '1h', got 'x'",
        "cards.gpu0.reserve": "expected a size like '24GiB' or '512MiB', got 'zz'",
        "policy.ram_budget": "'5' has no unit; write '5GiB' or '5MiB' (or '5B' for bytes); or "
                             "'auto' (the default: 80% of the host RAM available when berthd "
                             "starts)",
        "policy.read_interval": probs["policy.read_interval"],
        "policy.min_turn": "a duration cannot be negative, got -1",
        "engines.e.need": "'3' has no unit; write '3GiB' or '3MiB' (or '3B' for bytes)"}, probs
    assert probs["policy.read_interval"].startswith("must be at least 50ms, got '1ms'")
    assert ConfigError("f", [("policy.release_grace", "policy.release_grace: x")]).problems \
        == [("policy.release_grace", "x")]


def test_a_key_in_the_wrong_table_names_the_table_it_belongs_in():
    # A new user's release_grace under [driver], or reserve before any table: "unknown key"
    # with this table's keys listed said nothing of where the key goes.
    _one({"driver": {"release_grace": "20s"}}, "driver.release_grace", "unknown key",
         "(did you mean [policy] release_grace?)", "[driver] allows: kind")
    _one({"reserve": "1GiB"}, "reserve", "(did you mean [cards.<name>] reserve?)", "'1GiB'")
    _one({"kind": "sim"}, "kind", "(did you mean [driver] kind?)")
    _one({"engines": {"e": {"size": "1GiB", "reserve": "1GiB"}}}, "engines.e.reserve",
         "(did you mean [cards.<name>] reserve?)")
    _one({"driver": {"total": "8GiB"}}, "driver.total", "(did you mean [[driver.cards]] total?)")
    _one({"policy": {"key": "k" * 16}}, "policy.key",
         "(did you mean [board] key or [api] key or [network] key?)")
    # a key of no other table still gets the look-alike of its own
    _one({"policy": {"relase_grace": "1s"}}, "policy.relase_grace",
         "(did you mean 'release_grace'?)")


def test_an_unknown_sim_card_entry_is_reported_at_its_key():
    _one({"driver": SIM, "cards": {"gpu7": {"reserve": "1GiB"}}}, "cards.gpu7", "'gpu7'")


def test_every_problem_is_listed_at_once_values_and_cross_checks_together():
    probs = _problems({"driver": SIM, "cards": {"gpu7": {}, "gpu1": {"reserve": "lots"}},
                       "policy": {"read_interval": "0s"},
                       "engines": {"e": {"size": "8GiB", "need": "9GiB", "priority": True},
                                   "f": {"card": "gpu9"}}})
    assert set(probs) == {"cards.gpu7", "cards.gpu1.reserve", "policy.read_interval",
                          "engines.e.need", "engines.e.priority", "engines.f.card"}, probs


def test_the_summary_echoes_baselines_and_the_ram_budget():
    from berth.config import summary
    cfg = parse({"driver": SIM, "cards": {"gpu0": {"baseline": "600MiB"}},
                 "policy": {"ram_budget": "64GiB"}})
    text = summary(cfg)
    assert "baseline 600.0MiB (configured)" in text and "64.0GiB" in text
    nvml = summary(parse({"cards": {"gpu0": {"baseline": "1GiB"}}}))
    assert "baseline 1.0GiB (configured)" in nvml and "ram budget for parks: auto" in nvml



def test_the_summary_says_how_the_comfyui_node_leases():
    """The node leases [engines.comfyui] under the growth bound (allowance 1 GiB unless set)
    and parks by its hook; `berth config check` said "bound declared ...; no park"."""
    from berth.config import summary
    line = [x for x in summary(parse({"engines": {"comfyui": {"size": "20GiB"}}})).splitlines()
            if x.startswith("engine comfyui")][0]
    assert "bound growth" in line and "allowance 1.0GiB" in line and "hook" in line, line
    line = [x for x in summary(parse({"engines": {"comfyui": {"size": "20GiB",
                                                              "bound": "declared"}}})).splitlines()
            if x.startswith("engine comfyui")][0]
    assert "bound declared" in line, line
    from berth.config.summary import COMFYUI, COMFYUI_ALLOWANCE_BYTES
    from berth_hosts.comfyui.agent import DEFAULT_ALLOWANCE_BYTES, ENGINE
    assert (COMFYUI, COMFYUI_ALLOWANCE_BYTES) == (ENGINE, DEFAULT_ALLOWANCE_BYTES)

# -- what the config names, against the plugins (issue 11 "Plugins checked at startup") -------
TYPO = '''
[engines.qwen]
url = "http://127.0.0.1:9"
front = "127.0.0.1:9"
park = "hook"
adapter = "vlmm"
'''


def test_config_check_refuses_an_adapter_no_plugin_carries_out(tmp_path):
    f = tmp_path / "berth.toml"
    f.write_text(TYPO)
    out = subprocess.run([BERTH, "config", "check", str(f)], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert "engines.qwen.adapter" in out.stderr and "'vlmm'" in out.stderr, out.stderr
    assert "did you mean 'vllm'" in out.stderr, out.stderr
    # The adapters the registry holds (berth.adapters), not every mechanism (issue 38).
    assert "known adapters: llamacpp, ollama, protocol, sglang, vllm" in out.stderr, out.stderr
    f.write_text(TYPO.replace("vlmm", "vllm"))
    out = subprocess.run([BERTH, "config", "check", str(f)], capture_output=True, text=True)
    assert out.returncode == 0 and "park=hook/vllm" in out.stdout, out


def test_a_hook_park_without_an_adapter_names_the_installed_adapters():
    with pytest.raises(ConfigError) as e:
        parse({"engines": {"a": {"front": "127.0.0.1:1", "park": "hook"}}})
    assert "needs an adapter (installed: llamacpp, ollama, protocol, sglang, vllm)" in str(e.value)


def test_config_check_refuses_an_unknown_park_mechanism(tmp_path):
    f = tmp_path / "berth.toml"
    f.write_text(TYPO.replace('park = "hook"', 'park = "hok"'))
    out = subprocess.run([BERTH, "config", "check", str(f)], capture_output=True, text=True)
    assert out.returncode == 2 and "engines.qwen.park" in out.stderr, out
    assert "'hook'" in out.stderr and "'hok'" in out.stderr, out.stderr


def test_berthd_refuses_an_adapter_no_plugin_carries_out_before_writing_anything(tmp_path):
    from tests.berthd import sim_config
    cfg = sim_config(tmp_path, [("gpu0", "24GiB")], extra=TYPO)
    env = {**os.environ, "BERTH_STATE_DIR": str(tmp_path / "state"),
           "BERTH_SOCKET": str(tmp_path / "state" / "berthd.sock"),
           "BERTH_SIM_DIR": str(tmp_path / "sim")}
    out = subprocess.run([BERTH, "daemon", "--config", str(cfg)], env=env, capture_output=True,
                         text=True, timeout=30)
    text = out.stderr.strip()
    assert out.returncode == 2 and len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert "'vlmm'" in text and "llamacpp" in text, text
    assert not (tmp_path / "state").exists() and not (tmp_path / "sim").exists()


def test_an_engine_naming_what_no_plugin_carries_out_is_named_with_its_key():
    from berth.config import plugin_problems
    cfg = parse({"engines": {"a": {"front": "127.0.0.1:1", "park": "hook", "adapter": "vllm"},
                             "b": {"front": "127.0.0.1:2", "lend": True},
                             "c": {"supervisor": "prog"}}})
    assert plugin_problems(cfg, {"vllm", "protocol", "supervisor"}) == []
    probs = dict(plugin_problems(cfg, {"checkpoint"}))
    assert set(probs) == {"engines.a.adapter", "engines.b.lend", "engines.c.supervisor"}, probs
    assert all("checkpoint" in m for m in probs.values())


# -- checks on the typed models (issue 11): nothing hidden, nothing invented ------------------
def test_a_tables_own_rule_is_reported_even_beside_a_bad_value_of_that_table():
    probs = _problems({"engines": {"e": {"priority": True, "lend": True}}})
    assert set(probs) == {"engines.e.priority", "engines.e"} and "front" in probs["engines.e"]


def test_a_tables_own_rule_hides_no_check_between_values():
    probs = _problems({"engines": {"e": {"lend": True, "size": "8GiB", "need": "9GiB"}}})
    assert set(probs) == {"engines.e", "engines.e.need"}, probs


def test_a_refused_sim_card_keeps_the_others_at_their_own_index():
    probs = _problems({"driver": {"kind": "sim", "cards": [5, {"name": "g", "total": "256MiB"}]}})
    assert set(probs) == {"driver.cards.0", "driver.cards.1.total"}, probs


def test_a_sim_card_without_total_is_named_and_the_rest_still_checked():
    # This raised a TypeError out of the old raw-document cross-checks.
    probs = _problems({"driver": {"kind": "sim", "cards": [{"pci": "0000:03:00.0", "name": "g"}]},
                       "engines": {"e": {"size": "600MiB", "need": "24GiB"}}})
    assert probs["driver.cards.0.total"] == "missing: this key is required", probs
    assert "'24GiB'" in probs["engines.e.need"] and "'600MiB'" in probs["engines.e.need"]


def test_a_pci_given_by_default_counts_for_duplicates():
    _one({"driver": {"kind": "sim", "cards": [{"name": "a", "total": "8GiB"},
                                              {"pci": "01:00.0", "name": "b", "total": "8GiB"}]}},
         "driver.cards.1.pci", "'0000:01:00.0'", "driver.cards.0")



@pytest.mark.parametrize("doc, key", [({"engines": {"x": 5}}, "engines.x"), ({"driver": 5}, "driver"),
                                      ({"cards": {"gpu0": "x"}}, "cards.gpu0")])
def test_a_value_where_a_table_belongs_is_named_in_toml_words(doc, key):
    """It read "Input should be a valid dictionary or instance of EngineConfig (got 5)"."""
    with pytest.raises(ConfigError) as e:
        parse(doc)
    text = str(e.value)
    assert f"{key}: expected a table ([{key}] with its keys), got " in text, text
    assert "instance of" not in text and "Config" not in text.split("\n", 1)[1], text


@pytest.mark.parametrize("doc,key", [
    ({"engines": {"e": {"size": 14}}}, "engines.e.size"),
    ({"engines": {"e": {"size": "14"}}}, "engines.e.size"),
    ({"engines": {"e": {"size": "8GiB", "need": 6}}}, "engines.e.need"),
    ({"cards": {"gpu0": {"reserve": 1}}}, "cards.gpu0.reserve"),
    ({"policy": {"ram_budget": 64}}, "policy.ram_budget"),
    ({"driver": {"kind": "sim", "cards": [{"pci": "01:00.0", "name": "g", "total": 24}]}},
     "driver.cards.0.total"),
])
def test_a_size_without_a_unit_is_refused_not_read_as_bytes(doc, key):
    # `size = 14` meant 14GiB: read as 14 bytes it leases nothing, and the engine it admits
    # then runs into the memory of others (an OOM on the card).
    msg = _one(doc, key, "no unit")
    assert "GiB" in msg, msg


def test_a_size_of_zero_needs_no_unit():
    cfg = parse({"cards": {"gpu0": {"reserve": 0}}})
    assert cfg.cards["gpu0"].reserve == 0
