"""The plugin contract: registration, validation at startup, entry points, run_action, is_write."""

from __future__ import annotations

import asyncio

import pytest

from berth_plugins import hookspecs
from berth_plugins.hookspecs import MechanismError, hookimpl
from berth_plugins.manager import (
    ACTION_HOOKS,
    BUILTINS,
    DECISION_HOOKS,
    PluginRefused,
    adapters,
    is_write,
    make_plugin_manager,
    mechanisms,
    run_action,
)

from .conftest import ctx

RECORDING_PLUGIN = """
    from berth_plugins.hookspecs import hookimpl

    calls = []

    @hookimpl
    def berth_mechanisms():
        return ["myplug"]

    async def _park(ctx):
        calls.append(("park", ctx.engine))

    @hookimpl
    def berth_park(ctx):
        return _park(ctx) if ctx.mechanism == "myplug" else None
"""


def test_builtins_register_cleanly():
    pm = make_plugin_manager(load_entry_points=False)
    own = ["llamacpp", "ollama", "protocol", "sglang", "vllm"]   # berth-gpu's berth.adapters
    assert [name for name, _ in pm.list_name_plugin()] == list(BUILTINS) + own
    assert adapters(pm) == own
    assert mechanisms(pm) == {"checkpoint", *own}
    specs = {n for n in dir(hookspecs) if n.startswith("berth_")}
    assert specs == set(ACTION_HOOKS) | set(DECISION_HOOKS)


def test_third_party_plugin_found_through_its_entry_point_is_called(dists):
    dists.add("berth-myplug", {"myplug": "myplug_mod"}, {"myplug_mod": RECORDING_PLUGIN})
    pm = make_plugin_manager()
    assert pm.has_plugin("myplug")
    assert "myplug" in mechanisms(pm)
    assert sorted(d.project_name for _, d in pm.list_plugin_distinfo()) == [
        "berth-gpu", "berth-myplug"]      # berth-gpu: the supervisord host's entry point
    asyncio.run(run_action(pm, "berth_park", ctx("myplug")))
    import myplug_mod
    assert myplug_mod.calls == [("park", "e")]


def test_misspelled_hook_is_refused_at_startup_naming_plugin_and_hook(dists):
    dists.add("berth-typo", {"typo": "typo_mod"}, {"typo_mod": """
        def berth_prak(ctx):      # not even marked: every berth_* function is a hook
            return None
    """})
    with pytest.raises(PluginRefused) as e:
        make_plugin_manager()
    msg = str(e.value)
    assert "'typo'" in msg and "'berth_prak'" in msg and "did you mean 'berth_park'" in msg
    assert (e.value.plugin, e.value.hook) == ("typo", "berth_prak")


def test_async_decision_hook_is_refused(dists):
    dists.add("berth-asyncfront", {"asyncfront": "asyncfront_mod"}, {"asyncfront_mod": """
        from berth_plugins.hookspecs import hookimpl

        @hookimpl
        async def berth_front_is_write(engine, method, path):
            return True
    """})
    with pytest.raises(PluginRefused, match="asyncfront.*berth_front_is_write.*plain `def`"):
        make_plugin_manager()


def test_async_action_hook_is_refused(dists):
    dists.add("berth-asyncpark", {"asyncpark": "asyncpark_mod"}, {"asyncpark_mod": """
        from berth_plugins.hookspecs import hookimpl

        @hookimpl
        async def berth_park(ctx):
            pass
    """})
    with pytest.raises(PluginRefused, match="asyncpark.*berth_park.*None otherwise"):
        make_plugin_manager()


def test_wrong_signature_is_refused(dists):
    dists.add("berth-badsig", {"badsig": "badsig_mod"}, {"badsig_mod": """
        from berth_plugins.hookspecs import hookimpl

        @hookimpl
        def berth_park(ctx, card):
            return None
    """})
    with pytest.raises(PluginRefused) as e:
        make_plugin_manager()
    assert e.value.plugin == "badsig" and e.value.hook == "berth_park"
    assert "card" in str(e.value)


def test_entry_point_that_cannot_be_imported_is_refused(dists):
    dists.add("berth-broken", {"broken": "no_such_module_here"}, {})
    with pytest.raises(PluginRefused, match="'broken'.*cannot be loaded.*ModuleNotFoundError"):
        make_plugin_manager()


def test_two_plugins_claiming_one_mechanism_are_refused(dists):
    dists.add("berth-dup", {"dup": "dup_mod"}, {"dup_mod": """
        from berth_plugins.hookspecs import hookimpl

        @hookimpl
        def berth_mechanisms():
            return ["vllm"]
    """})
    with pytest.raises(PluginRefused, match="'vllm' is already carried out by plugin "
                                            "'vllm'; block one"):
        make_plugin_manager()
    pm = make_plugin_manager(block=["vllm"])   # the operator picks the third-party one
    assert pm.has_plugin("dup") and "vllm" in mechanisms(pm)


def test_block_by_name(dists):
    dists.add("berth-typo2", {"typo2": "typo2_mod"}, {"typo2_mod": "def berth_prak(ctx): pass\n"})
    pm = make_plugin_manager(block=["typo2", "vllm", "berth_plugins.sglang"])
    assert not pm.has_plugin("typo2")
    assert mechanisms(pm) == {"checkpoint", "protocol", "llamacpp", "ollama", "supervisor"}
    assert adapters(pm) == ["llamacpp", "ollama", "protocol"]   # an adapter: by name or module
    with pytest.raises(ValueError, match="block: no plugin named 'vlm'"):
        make_plugin_manager(block=["vlm", "typo2"])


def test_run_action_with_no_implementer_is_a_mechanism_error():
    pm = make_plugin_manager(load_entry_points=False)
    with pytest.raises(MechanismError, match="no plugin carries out berth_park by 'nothing'"):
        asyncio.run(run_action(pm, "berth_park", ctx("nothing")))
    with pytest.raises(MechanismError, match="no plugin carries out berth_lend by 'vllm'"):
        asyncio.run(run_action(pm, "berth_lend", ctx("vllm")))
    with pytest.raises(ValueError, match="hook_name"):
        asyncio.run(run_action(pm, "berth_vouch", ctx("vllm")))


class _Slow:
    @hookimpl
    def berth_park(self, ctx):
        return asyncio.sleep(30) if ctx.mechanism == "slow" else None


class _Both:
    def __init__(self, fail: Exception | None = None):
        self.fail = fail

    @hookimpl
    def berth_park(self, ctx):
        if ctx.mechanism != "slow":
            return None
        if self.fail:
            raise self.fail
        return asyncio.sleep(0)


def test_run_action_timeout_is_a_mechanism_error():
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_Slow(), name="slow")
    with pytest.raises(MechanismError, match="berth_park for engine 'e' did not finish within "
                                             "0.2 s"):
        asyncio.run(run_action(pm, "berth_park", ctx("slow", timeout_s=0.2)))


def test_run_action_with_two_implementers_names_both():
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_Slow(), name="slow")
    pm.register(_Both(), name="other")
    with pytest.raises(MechanismError, match="more than one plugin.*other, slow"):
        asyncio.run(run_action(pm, "berth_park", ctx("slow")))


def test_run_action_wraps_a_plugin_exception_naming_the_plugin():
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_Both(fail=KeyError("x")), name="buggy")
    with pytest.raises(MechanismError, match="plugin 'buggy' failed in berth_park: KeyError"):
        asyncio.run(run_action(pm, "berth_park", ctx("slow")))


def test_run_action_refuses_a_wake_without_confirmed_room():
    pm = make_plugin_manager(load_entry_points=False)
    with pytest.raises(MechanismError, match="room not confirmed"):
        asyncio.run(run_action(pm, "berth_wake", ctx("protocol", engine_url="http://x")))


class _ComfyQueue:
    @hookimpl
    def berth_front_is_write(self, engine, method, path):
        if engine == "comfyui" and method == "POST" and path == "/queue":
            return False
        return None


def test_is_write_reads_never_wake_and_adapters_answer_first():
    pm = make_plugin_manager(load_entry_points=False)
    for method in ("GET", "HEAD", "OPTIONS", "get"):
        assert not is_write(pm, "e", method, "/v1/models")
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert is_write(pm, "e", method, "/v1/chat/completions")
    pm.register(_ComfyQueue(), name="comfy-queue")   # registered after the first call: still seen
    assert not is_write(pm, "comfyui", "POST", "/queue")
    assert is_write(pm, "comfyui", "POST", "/prompt")
    bare = make_plugin_manager(block=["builtin_front"], load_entry_points=False)
    assert is_write(bare, "e", "POST", "/x") and not is_write(bare, "e", "GET", "/x")


ADAPTER = """
    from berth_plugins.hookspecs import hookimpl

    @hookimpl
    def berth_mechanisms():
        return {claims!r}
"""


def test_a_third_party_adapter_registers_under_its_name(dists):
    dists.add("berth-myeng", {"myeng": "myeng_mod"}, {"myeng_mod": ADAPTER.format(
        claims=["myeng"])}, group="berth.adapters")
    pm = make_plugin_manager()
    assert "myeng" in adapters(pm) and "myeng" in mechanisms(pm) and pm.has_plugin("myeng")
    assert "myeng" not in adapters(make_plugin_manager(load_entry_points=False))


def test_an_adapter_that_does_not_carry_out_its_name_is_refused(dists):
    dists.add("berth-misnamed", {"misnamed": "misnamed_mod"}, {"misnamed_mod": ADAPTER.format(
        claims=["other"])}, group="berth.adapters")
    with pytest.raises(PluginRefused, match="'misnamed'.*must name itself among its mechanisms; "
                                            "it returns \\['other'\\]"):
        make_plugin_manager()


def test_an_adapter_name_taken_twice_is_refused(dists):
    dists.add("berth-vllm2", {"vllm": "vllm2_mod"}, {"vllm2_mod": ADAPTER.format(
        claims=["vllm"])}, group="berth.adapters")
    with pytest.raises(PluginRefused, match="'vllm'.*another adapter has this name"):
        make_plugin_manager()
