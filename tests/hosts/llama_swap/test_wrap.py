"""``berth llama-swap wrap`` on realistic configs (issue 5): every cmd runs under ``berth run``
with a front on llama-swap's ``${PORT}`` and the engine on ``{port}``; everything else kept."""

import textwrap
from pathlib import Path

import pytest
from berth_hosts.llama_swap import WrapError, WrapOptions, wrap_text
from berth_hosts.llama_swap.timeouts import MIN_UNLOAD_TIMEOUT_S

from .conftest import EXAMPLES, llama_swap_argv, load_yaml, split_run

FRONT = "127.0.0.1:${PORT}"
#: Keys wrap may change on a model; everything else must come out as it went in.
CHANGED = {"cmd", "proxy", "unloadTimeout"}


def wrap(text: str, **opts):
    out, report = wrap_text(textwrap.dedent(text), "test.yaml", WrapOptions(**opts))
    return load_yaml(out), report, out


def groups_of(doc: dict) -> dict:
    router = (doc.get("routing") or {}).get("router")
    return router["settings"]["groups"] if router else doc["groups"]


def test_there_are_at_least_three_realistic_examples():
    assert len(EXAMPLES) >= 3


def test_every_cmd_is_wrapped_and_the_engine_argv_is_unchanged(example: Path):
    before = load_yaml(example.read_text())
    after, report, _ = wrap(example.read_text())
    assert set(report.wrapped) == set(before["models"]) and not report.already
    for mid, model in before["models"].items():
        old = [a.replace("${PORT}", "{port}") for a in llama_swap_argv(before, mid)]
        head, opts, engine = split_run(llama_swap_argv(after, mid))
        assert head == ["berth", "run", "--engine", mid, "--front", FRONT], mid
        assert engine == old, mid
        assert not any("${PORT}" in a for a in engine), mid
        if "--port" in engine:
            port = engine[engine.index("--port") + 1]
            fixed = opts.get("--upstream")
            assert port == "{port}" or (fixed and fixed[0].endswith(":" + port)), (mid, port)
        if "${PORT}" not in str(model.get("proxy", "${PORT}")):
            assert opts["--upstream"] == [model["proxy"]]
            assert after["models"][mid]["proxy"] == "http://127.0.0.1:${PORT}"
        else:
            assert "--upstream" not in opts
            assert after["models"][mid].get("proxy") == model.get("proxy")
        check = model.get("checkEndpoint")
        assert opts.get("--health") == (None if check in (None, "/health") else [check])
        for key in set(model) - CHANGED:
            assert after["models"][mid][key] == model[key], (mid, key)


def test_macros_env_aliases_and_top_level_settings_are_kept(example: Path):
    before = load_yaml(example.read_text())
    after, _, _ = wrap(example.read_text())
    assert list(after["models"]) == list(before["models"])
    assert list(after.get("macros") or {}) == list(before.get("macros") or {})
    for name, value in (before.get("macros") or {}).items():
        expected = value.replace("${PORT}", "{port}") if isinstance(value, str) else value
        assert after["macros"][name] == expected
    for key in set(before) - {"models", "groups", "matrix", "routing", "healthCheckTimeout",
                              "unloadTimeout", "macros"}:
        assert after[key] == before[key], key


def test_groups_let_every_model_stay_loaded(example: Path):
    before = load_yaml(example.read_text())
    after, _, _ = wrap(example.read_text())
    groups = groups_of(after)
    members = [m for g in groups.values() for m in g["members"]]
    assert sorted(members) == sorted(before["models"])      # each model in exactly one group
    for name, group in groups.items():
        assert group["exclusive"] is False, name
        assert group["swap"] is False or name.startswith("berth-port-"), name
    router = (before.get("routing") or {}).get("router") or {}
    old_groups = before.get("groups") or (router.get("settings") or {}).get("groups") or {}
    for name, group in old_groups.items():
        assert groups[name]["members"] == group["members"]
        assert groups[name].get("persistent") == group.get("persistent")


def test_wrapping_twice_changes_nothing(example: Path):
    once, report1 = wrap_text(example.read_text(), example.name)
    twice, report2 = wrap_text(once, example.name)
    assert twice == once
    assert report2.wrapped == [] and sorted(report2.already) == sorted(report1.wrapped)


def test_llamacpp_pair_macro_groups_and_timeouts():
    path = next(p for p in EXAMPLES if p.stem == "llamacpp-pair")
    after, report, _ = wrap(path.read_text())
    assert "--port {port}" in after["macros"]["llama-server"]
    assert after["healthCheckTimeout"] == 300
    assert any("healthCheckTimeout: 120 s raised to 300 s" in w for w in report.warnings)
    assert after["groups"]["chat"]["swap"] is False
    assert after["groups"]["embeddings"]["persistent"] is True
    assert any("persistent" in n and "priority" in n for n in report.notes)
    # the block cmd stays a block; the one-line cmd stays one line
    assert after["models"]["qwen2.5-coder-14b"]["cmd"].count("\n") > 1
    assert "\n" not in after["models"]["llama-3.1-8b"]["cmd"]


def test_vllm_mix_matrix_docker_fixed_port_and_health_none():
    path = next(p for p in EXAMPLES if p.stem == "vllm-mix")
    before = load_yaml(path.read_text())
    after, report, _ = wrap(path.read_text())
    router = after["routing"]["router"]
    assert router["use"] == "group"
    assert router["settings"]["matrix"] == before["routing"]["router"]["settings"]["matrix"]
    assert after["routing"]["scheduler"] == before["routing"]["scheduler"]
    gemma = after["models"]["gemma-3-12b"]
    assert gemma["cmdStop"] == "docker stop --time 5 ${MODEL_ID}"
    assert "-p 127.0.0.1:{port}:8080" in gemma["cmd"]
    assert gemma["unloadTimeout"] == 20
    _, opts, _ = split_run(llama_swap_argv(after, "whisper"))
    assert opts["--health"] == ["none"]
    _, opts, engine = split_run(llama_swap_argv(after, "llama-3.1-8b-sglang"))
    assert opts["--upstream"] == ["http://127.0.0.1:30000"] and "30000" in engine
    assert not report.warnings        # 600 s, 20 s, and -e CUDA_VISIBLE_DEVICES are all fine


def test_multiline_keeps_comments_and_continuations_and_raises_timeouts():
    path = next(p for p in EXAMPLES if p.stem == "multiline")
    after, report, _ = wrap(path.read_text())
    cmd = after["models"]["qwen3-30b-a3b"]["cmd"]
    assert "# --n-cpu-moe 8 \\" in cmd and "# MoE:" in cmd
    assert after["macros"]["bin"] == "${env.HOME}/llama.cpp/build/bin"
    assert after["unloadTimeout"] == MIN_UNLOAD_TIMEOUT_S == 10
    assert after["models"]["qwen3-30b-a3b"]["unloadTimeout"] == 10
    assert after["healthCheckTimeout"] == 300
    assert "berth" in after["groups"]
    _, _, engine = split_run(llama_swap_argv(after, "phi-4-mini"))
    assert engine[:2] == ["sh", "-c"] and "--port {port}" in engine[2]


def test_fixed_ports_shared_by_two_models_keep_them_apart():
    path = next(p for p in EXAMPLES if p.stem == "fixed-ports")
    after, report, _ = wrap(path.read_text())
    assert after["groups"]["berth-port-9999"] == {"swap": True, "exclusive": False,
                                                  "members": ["qwen2.5", "smollm2"]}
    assert after["groups"]["berth"]["members"] == ["z-image"]
    assert any("qwen2.5, smollm2" in w and "same fixed address" in w for w in report.warnings)


# -- cases, one at a time -----------------------------------------------------------------------
def test_a_model_without_port_and_without_proxy_is_refused_by_name():
    with pytest.raises(WrapError, match=r"models\.image\.proxy: .*cmd has no \$\{PORT\}"):
        wrap("""
            models:
              image:
                cmd: /app/sd-server --listen-port 9999
            """)


def test_a_proxy_on_another_host_is_refused():
    with pytest.raises(WrapError, match=r"models\.far\.proxy: .*points at 10\.0\.0\.5"):
        wrap("""
            models:
              far:
                cmd: ssh gpu-box llama-server --port ${PORT}
                proxy: http://10.0.0.5:${PORT}
            """)


def test_a_fixed_port_model_keeps_its_engine_and_gets_a_front_port():
    after, report, _ = wrap("""
        models:
          coder:
            cmd: llama-server --host 127.0.0.1 --port 8999 -m c.gguf
            proxy: http://127.0.0.1:8999/v1
        """)
    head, opts, engine = split_run(llama_swap_argv(after, "coder"))
    assert head[-1] == FRONT and opts["--upstream"] == ["http://127.0.0.1:8999"]
    assert engine == ["llama-server", "--host", "127.0.0.1", "--port", "8999", "-m", "c.gguf"]
    assert after["models"]["coder"]["proxy"] == "http://127.0.0.1:${PORT}/v1"


def test_a_hand_wrapped_cmd_is_detected_and_left_alone():
    text = """
        models:
          a:
            cmd: /opt/berth/.venv/bin/berth run --engine a --front 127.0.0.1:${PORT} -- llama-server --port {port}
        """
    after, report, _ = wrap(text)
    assert report.already == ["a"] and report.wrapped == []
    assert after["models"]["a"]["cmd"] == load_yaml(textwrap.dedent(text))["models"]["a"]["cmd"]


def test_a_port_macro_used_outside_cmd_is_put_in_place_not_rewritten():
    after, report, _ = wrap("""
        macros:
          listen: "--host 127.0.0.1 --port ${PORT}"
        models:
          m:
            cmd: llama-server ${listen} -m x.gguf
            description: "llama-server ${listen}"
        """)
    assert after["macros"]["listen"] == "--host 127.0.0.1 --port ${PORT}"
    assert after["models"]["m"]["description"] == "llama-server ${listen}"
    assert "${listen}" not in after["models"]["m"]["cmd"]
    _, _, engine = split_run(llama_swap_argv(after, "m"))
    assert engine == ["llama-server", "--host", "127.0.0.1", "--port", "{port}", "-m", "x.gguf"]


def test_a_port_macro_declared_in_the_model_is_rewritten_there():
    after, _, _ = wrap("""
        models:
          m:
            macros:
              srv: "llama-server --port ${PORT}"
            cmd: ${srv} -m x.gguf
        """)
    assert after["models"]["m"]["macros"]["srv"] == "llama-server --port {port}"
    assert after["models"]["m"]["cmd"].endswith("-- ${srv} -m x.gguf")


def test_park_checkpoint_skips_containers_with_a_warning():
    after, report, _ = wrap("""
        models:
          native:
            cmd: llama-server --port ${PORT}
          boxed:
            cmd: docker run --rm --gpus all -e CUDA_VISIBLE_DEVICES -p ${PORT}:8080 img
            cmdStop: docker stop boxed
            unloadTimeout: 15
        """, park="checkpoint", checkpoint_path="/usr/local/bin/cuda-checkpoint")
    _, opts, _ = split_run(llama_swap_argv(after, "native"))
    assert opts["--park"] == ["checkpoint"]
    assert opts["--checkpoint-path"] == ["/usr/local/bin/cuda-checkpoint"]
    _, opts, _ = split_run(llama_swap_argv(after, "boxed"))
    assert "--park" not in opts
    assert any("models.boxed" in w and "cuda-checkpoint" in w for w in report.warnings)


def test_cards_pinned_by_env_or_hidden_from_a_container_are_warned_about():
    _, report, _ = wrap("""
        models:
          pinned:
            cmd: llama-server --port ${PORT}
            env: ["CUDA_VISIBLE_DEVICES=1"]
          boxed:
            cmd: docker run --rm --gpus all -p ${PORT}:8080 img
            cmdStop: docker stop boxed
        """)
    assert any("models.pinned.env" in w and "card" in w for w in report.warnings)
    assert any("models.boxed.cmd" in w and "-e CUDA_VISIBLE_DEVICES" in w for w in report.warnings)
    assert any("models.boxed.unloadTimeout" in w for w in report.warnings)


def test_size_from_puts_sizes_on_the_run_line(tmp_path):
    from berth_hosts.llama_swap import sizes_from
    toml = tmp_path / "berth.toml"
    toml.write_text('[engines."qwen:7b"]\nsize = "9GiB"\ncard = "gpu1"\npriority = 5\n'
                    '[engines.small]\nsize = "card"\n')
    sizes = sizes_from(toml)
    assert sizes == {"qwen:7b": ["9GiB@gpu1"], "small": ["card"]}
    after, report, _ = wrap("""
        models:
          "qwen:7b":
            cmd: llama-server --port ${PORT}
          other model:
            cmd: llama-server --port ${PORT}
        """, sizes=sizes)
    head, opts, _ = split_run(llama_swap_argv(after, "qwen:7b"))
    assert opts["--size"] == ["9GiB@gpu1"]
    head, opts, _ = split_run(llama_swap_argv(after, "other model"))
    assert head[3] == "other-model" and "--size" not in opts      # berthd refuses a space
    assert any('[engines."other-model"]' in w and "no " in w for w in report.warnings)


def test_legacy_matrix_becomes_groups():
    after, report, _ = wrap("""
        models:
          a: {cmd: "llama-server --port ${PORT}"}
          b: {cmd: "llama-server --port ${PORT}"}
        matrix:
          sets:
            both: "a & b"
        """)
    assert "matrix" not in after
    assert after["groups"]["berth"] == {"swap": False, "exclusive": False, "members": ["a", "b"]}


def test_mixed_group_forms_are_refused_as_llama_swap_would():
    with pytest.raises(WrapError, match="both the legacy"):
        wrap("""
            models:
              a: {cmd: "llama-server --port ${PORT}"}
            groups:
              g: {members: [a]}
            routing:
              router: {use: group}
            """)


def test_yaml_1_2_scalars_survive():
    after, _, out = wrap("""
        models:
          a:
            cmd: llama-server --port ${PORT}
            description: on
            metadata: {time: "1:20", when: 2025-01-01}
        """)
    assert after["models"]["a"]["description"] == "on"
    assert after["models"]["a"]["metadata"] == {"time": "1:20", "when": "2025-01-01"}


@pytest.mark.parametrize("text, match", [
    ("models:\n  a:\n    cmd: [unclosed\n", r"test\.yaml: not valid YAML: line \d+, column \d+"),
    ("models:\n  a: {cmd: x}\n  a: {cmd: y}\n", r"key 'a' is given twice"),
    ("", r"test\.yaml: empty"),
    ("- a\n- b\n", r"the top level: expected a mapping"),
    ("healthCheckTimeout: 300\n", r"models: the config has no models"),
    ("models: {}\n", r"models: the config has no models"),
    ("models:\n  a:\n    proxy: http://127.0.0.1:1\n", r"models\.a\.cmd: missing or empty"),
    ("models:\n  a:\n    cmd: |\n      # only a comment\n", r"models\.a\.cmd: no command is left"),
    ("models:\n  a: llama-server\n", r"models\.a: expected a mapping"),
    ("healthCheckTimeout: soon\nmodels:\n  a: {cmd: 'x --port ${PORT}'}\n",
     r"healthCheckTimeout: expected a number of seconds"),
])
def test_errors_name_the_source_the_model_and_the_key(text, match):
    with pytest.raises(WrapError, match=match):
        wrap_text(text, "test.yaml")


def test_a_fixed_address_shared_across_groups_is_warned_about():
    _, report, _ = wrap("""
        models:
          a: {cmd: "srv --port 9000", proxy: "http://127.0.0.1:9000"}
          b: {cmd: "srv --port 9000", proxy: "http://localhost:9000"}
        groups:
          one: {members: [a]}
          two: {members: [b]}
        """)
    assert any("a, b listen on the same fixed address 127.0.0.1:9000" in w
               and "one, two" in w for w in report.warnings)


def test_a_container_stop_with_its_own_timeout_needs_no_warning():
    _, report, _ = wrap("""
        models:
          quick:
            cmd: docker run --rm -e CUDA_VISIBLE_DEVICES -p ${PORT}:8080 img
            cmdStop: docker stop -t 2 quick
          slow:
            cmd: docker run --rm -e CUDA_VISIBLE_DEVICES -p ${PORT}:8080 img
            cmdStop: docker stop slow
            unloadTimeout: 12
        """)
    assert [w for w in report.warnings if "unloadTimeout" in w] == [
        "models.slow.unloadTimeout: 12 s may be short: its cmdStop waits up to 10 s for the "
        "container, then berth run confirms the memory free; consider unloadTimeout: 14"]


def test_a_proxy_path_is_kept_and_berth_run_checks_health_under_it():
    after, _, _ = wrap("""
        models:
          a:
            cmd: srv --port 9000
            proxy: http://localhost:9000/api
          b:
            cmd: srv --port ${PORT}
            proxy: http://127.0.0.1:${PORT}/v1
            checkEndpoint: /models
        """)
    assert after["models"]["a"]["proxy"] == "http://127.0.0.1:${PORT}/api"
    _, opts, _ = split_run(llama_swap_argv(after, "a"))
    assert opts["--upstream"] == ["http://localhost:9000"] and opts["--health"] == ["/api/health"]
    _, opts, _ = split_run(llama_swap_argv(after, "b"))
    assert opts["--health"] == ["/v1/models"] and after["models"]["b"]["proxy"].endswith("/v1")


@pytest.mark.parametrize("proxy", ["http://[::1]:${PORT}", "http://127.0.0.1:${PORT}0",
                                   "http://127.0.0.1:80/${PORT}", "ftp://x:1", "http://h:port"])
def test_proxies_the_front_cannot_serve_are_refused(proxy):
    with pytest.raises(WrapError, match=r"models\.a\.proxy: "):
        wrap(f"""
            models:
              a:
                cmd: srv --port ${{PORT}}
                proxy: "{proxy}"
            """)


# -- engine names (berthd refuses whitespace and control characters in one, accepts "/") --------
def test_a_model_id_with_a_slash_is_the_engine_name_as_it_is():
    after, report, out = wrap("""
        models:
          Qwen/Qwen2.5-7B:
            cmd: llama-server --port ${PORT} -hf Qwen/Qwen2.5-7B-Instruct-GGUF
        """)
    head, _, _ = split_run(llama_swap_argv(after, "Qwen/Qwen2.5-7B"))
    assert head[3] == "Qwen/Qwen2.5-7B"
    assert after["models"]["Qwen/Qwen2.5-7B"]["cmd"].split(" ", 1)[1].startswith(
        "run --engine Qwen/Qwen2.5-7B --front")                        # not quoted
    assert report.engines == {} and not [w for w in report.warnings if "engine name" in w]


def test_a_model_id_with_whitespace_gets_a_safe_engine_name_and_a_warning():
    after, report, _ = wrap("""
        models:
          "Qwen 2.5  7B":
            cmd: llama-server --port ${PORT}
          "a\tb":
            cmd: llama-server --port ${PORT}
          a-b:
            cmd: llama-server --port ${PORT}
        """)
    assert report.engines == {"Qwen 2.5  7B": "Qwen-2.5-7B", "a\tb": "a-b-2"}
    assert split_run(llama_swap_argv(after, "Qwen 2.5  7B"))[0][3] == "Qwen-2.5-7B"
    assert split_run(llama_swap_argv(after, "a\tb"))[0][3] == "a-b-2"
    assert split_run(llama_swap_argv(after, "a-b"))[0][3] == "a-b"       # kept; the other moved
    warned = [w for w in report.warnings if "engine name" in w]
    assert len(warned) == 2
    assert ("'Qwen 2.5  7B'" in warned[0] and "--engine Qwen-2.5-7B" in warned[0]
            and '[engines."Qwen-2.5-7B"]' in warned[0])
    # the model ID itself is unchanged where llama-swap uses it: models and groups
    assert "Qwen 2.5  7B" in after["models"]
    assert "Qwen 2.5  7B" in after["groups"]["berth"]["members"]


def test_size_from_looks_up_the_engine_name_not_the_model_id():
    after, report, _ = wrap("""
        models:
          "big model":
            cmd: llama-server --port ${PORT}
        """, sizes={"big-model": ["20GiB"]})
    _, opts, _ = split_run(llama_swap_argv(after, "big model"))
    assert opts["--size"] == ["20GiB"]
    assert not [w for w in report.warnings if "no [engines." in w]


def test_an_already_wrapped_engine_name_is_not_taken_again():
    after, report, _ = wrap("""
        models:
          x:
            cmd: berth run --engine "a-b" --front 127.0.0.1:${PORT} -- srv --port {port}
          "a b":
            cmd: srv --port ${PORT}
        """)
    assert report.engines == {"a b": "a-b-2"}


# -- proxies on another host ---------------------------------------------------------------------
@pytest.mark.parametrize("proxy, host", [
    ("http://10.0.0.5:9000", "10.0.0.5"),
    ("http://gpu-box.lan:9000/v1", "gpu-box.lan"),
    ("http://[fe80::1]:9000", "fe80::1"),
    ("https://api.example.com", "api.example.com"),
])
def test_a_fixed_proxy_on_another_host_is_refused_naming_the_model_and_the_proxy(proxy, host):
    with pytest.raises(WrapError) as e:
        wrap(f"""
            models:
              a:
                cmd: /opt/srv --port 9000
                proxy: {proxy}
            """)
    msg = str(e.value)
    assert msg.startswith("test.yaml: models.a.proxy: ")
    assert repr(proxy) in msg and f"points at {host}, another host" in msg


@pytest.mark.parametrize("proxy", ["http://127.0.0.1:9000", "http://127.0.0.2:9000",
                                   "http://localhost:9000", "http://LOCALHOST:9000",
                                   "http://[::1]:9000", "http://0.0.0.0:9000"])
def test_a_fixed_proxy_on_loopback_is_wrapped(proxy):
    after, _, _ = wrap(f"""
        models:
          a:
            cmd: /opt/srv --port 9000
            proxy: "{proxy}"
        """)
    _, opts, _ = split_run(llama_swap_argv(after, "a"))
    assert opts["--upstream"] == [proxy]
    assert after["models"]["a"]["proxy"] == "http://127.0.0.1:${PORT}"


def test_a_remote_proxy_through_a_macro_is_refused_too():
    with pytest.raises(WrapError, match=r"models\.a\.proxy: '\$\{far\}' points at 10\.1\.2\.3"):
        wrap("""
            macros:
              far: http://10.1.2.3:8000
            models:
              a: {cmd: "srv --port 8000", proxy: "${far}"}
            """)


# -- ${PORT} in env: the front's port once wrapped -------------------------------------------------
def test_port_in_env_through_a_macro_is_refused_with_advice():
    with pytest.raises(WrapError) as e:
        wrap("""
            macros:
              port-env: PORT_IS=${PORT}
            models:
              m:
                cmd: llama-server --port ${PORT}
                env: ["${port-env}"]
            """)
    msg = str(e.value)
    assert "models.m.env: '${port-env}' ('PORT_IS=${PORT}' once macros are expanded)" in msg
    assert "front's port" in msg and "--port ${PORT}" in msg and "{port}" in msg


def test_port_in_env_directly_or_through_a_model_macro_is_refused():
    for text in ("""
            models:
              m:
                cmd: llama-server --port ${PORT}
                env: ["LLAMA_ARG_PORT=${PORT}", A=1]
            """, """
            macros:
              p: "${PORT}"
            models:
              m:
                macros:
                  q: "X=${p}"
                cmd: llama-server --port ${PORT}
                env: ["${q}"]
            """):
        with pytest.raises(WrapError, match=r"models\.m\.env: .*front's port"):
            wrap(text)


def test_port_elsewhere_than_env_is_still_fine_and_an_already_wrapped_env_is_warned_about():
    _, report, _ = wrap("""
        models:
          m:
            cmd: llama-server --port ${PORT}
            env: [A=1, "B=${MODEL_ID}"]
            description: "on ${PORT}"
          w:
            cmd: berth run --engine w --front 127.0.0.1:${PORT} -- srv --port {port}
            env: ["P=${PORT}"]
        """)
    assert report.wrapped == ["m"]
    assert any(w.startswith("models.w.env: 'P=${PORT}'") for w in report.warnings)


# -- cmd: not a string, an unknown macro, a quote left open --------------------------------------
@pytest.mark.parametrize("value, kind", [("5", "a number"), ("[llama-server, --port, x]", "a list"),
                                         ("true", "a boolean"), ("{a: b}", "a mapping")])
def test_a_cmd_that_is_not_a_string_says_so(value, kind):
    with pytest.raises(WrapError, match=rf"models\.a\.cmd: must be a string .*got {kind}"):
        wrap_text(f"models:\n  a:\n    cmd: {value}\n", "test.yaml")


@pytest.mark.parametrize("text, key, name", [
    ("models:\n  m:\n    cmd: llama-server --port ${PORT} -m ${gguf}/a.gguf\n", "cmd", "gguf"),
    ("macros:\n  srv: llama-server ${flags}\nmodels:\n  m:\n    cmd: ${srv} --port ${PORT}\n",
     "cmd", "flags"),
    ("models:\n  m:\n    cmd: srv --port ${PORT} --pid ${PID}\n", "cmd", "PID"),
    ("models:\n  m:\n    cmd: srv --port ${PORT}\n    cmdStop: kill ${SIG} ${PID}\n",
     "cmdStop", "SIG"),
    ("models:\n  m:\n    cmd: srv --port ${PORT}\n    env: [\"A=${nope}\"]\n", "env", "nope"),
    ("models:\n  m:\n    cmd: srv --port 9\n    proxy: http://127.0.0.1:${p}\n", "proxy", "p"),
    ("models:\n  m:\n    cmd: srv --port ${PORT}\n    checkEndpoint: /${h}\n",
     "checkEndpoint", "h"),
])
def test_an_undeclared_macro_is_refused_naming_the_model_key_and_macro(text, key, name):
    with pytest.raises(WrapError, match=rf"test\.yaml: models\.m\.{key}: unknown macro "
                                        rf"\$\{{{name}\}}"):
        wrap_text(text, "test.yaml")


def test_declared_macros_pid_in_cmdstop_env_macros_and_comments_are_not_unknown():
    after, _, _ = wrap("""
        macros:
          bin: ${env.HOME}/bin
        models:
          m:
            macros:
              ctx: 4096
            cmd: |
              # ${not-declared} in a comment line is never expanded
              ${bin}/llama-server --port ${PORT} -c ${ctx} --alias ${MODEL_ID}
            cmdStop: kill -TERM ${PID}
        """)
    assert llama_swap_argv(after, "m")[-1] == "m"


@pytest.mark.parametrize("cmd, quote, shown", [
    ("sh -c 'exec llama-server --port ${PORT}", "'", "'exec llama-server --port ${PORT}"),
    ('llama-server --port ${PORT} --chat-template "{{x}}', '"', '"{{x}}'),
    ("llama-server --port ${PORT} --alias it's\n      -m x.gguf", "'", "'s -m x.gguf"),
])
def test_a_quote_left_open_is_refused_naming_the_model(cmd, quote, shown):
    with pytest.raises(WrapError) as e:
        wrap_text(f"models:\n  m:\n    cmd: |\n      {cmd}\n", "test.yaml")
    assert str(e.value).startswith(f"test.yaml: models.m.cmd: the quote {quote} that opens "
                                   f"{shown!r} is never closed")


def test_a_quote_left_open_by_a_macro_is_refused_and_a_closed_one_is_not():
    with pytest.raises(WrapError, match=r"models\.m\.cmd: the quote ' that opens "
                                        r"\"'a b --port \$\{PORT\}\""):
        wrap("""
            macros:
              half: "'a b"
            models:
              m:
                cmd: sh -c ${half} --port ${PORT}
            """)
    after, _, _ = wrap("""
        macros:
          half: "'a b"
        models:
          m:
            cmd: sh -c ${half} --port ${PORT}'
        """)
    assert split_run(llama_swap_argv(after, "m"))[2] == ["sh", "-c", "a b --port {port}"]


@pytest.mark.parametrize("key,value", [("env", '"HF_HOME=/srv/hf"'), ("aliases", "5"),
                                       ("aliases", "{a: b}"), ("env", "[[X=1]]")])
def test_env_and_aliases_that_are_not_lists_of_strings_are_refused(key, value):
    # llama-swap reads both as lists of strings and refuses to load anything else
    with pytest.raises(WrapError, match=rf"models\.a\.{key}: expected a list of strings"):
        wrap(f"""
            models:
              a:
                cmd: srv --port ${{PORT}}
                {key}: {value}
            """)


def test_a_llama_server_with_no_fit_is_said_to_be_bounded_by_its_lease():
    """Issue 37: llama-server's --fit fills what is free; wrap says that berth run bounds it,
    and that one pinning its fit is left as written."""
    _, report, _ = wrap("""
        models:
          free:
            cmd: llama-server --port ${PORT} -m /m/a.gguf
          pinned:
            cmd: llama-server --port ${PORT} -m /m/b.gguf -ngl 99 -c 8192
          other:
            cmd: vllm serve m --port ${PORT}
        """)
    notes = "\n".join(report.notes)
    assert "models.free.cmd: llama-server sets no fit of its own: berth run adds --fit-target" \
        in notes, notes
    assert "models.pinned.cmd: llama-server left as written: it sets -ngl 99 and -c 8192" \
        in notes, notes
    assert "models.other.cmd: llama-server" not in notes
