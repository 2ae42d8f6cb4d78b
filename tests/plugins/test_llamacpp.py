"""The llama.cpp plugin against a small fake router (reference/park-mechanisms.md "llama.cpp
server", "Router mode"): load and unload answer at once, ``GET /models`` shows the status settle
over the next polls, and a failed load shows ``failed`` and ``exit_code``."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

from .conftest import ctx, serve

MODEL = "qwen3-8b"


class FakeRouter:
    """One model. Each command moves its status through ``steps`` (one per ``GET /models``)."""

    def __init__(self, status: dict | None = None, load_fails_with: int | None = None,
                 stale_failure: bool = False):
        self.status = status or {"value": "loaded", "args": ["llama-server"], "preset": ""}
        if stale_failure:
            self.status = {"value": "unloaded", "failed": True, "exit_code": 137}
        self.load_fails_with = load_fails_with
        self.steps: list[dict] = []
        self.calls: list[str] = []

    async def models(self, request: web.Request) -> web.Response:
        self.calls.append("GET /models")
        if self.steps:
            self.status = self.steps.pop(0)
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "llamacpp", "status": self.status},
            {"id": "other", "object": "model", "owned_by": "llamacpp",
             "status": {"value": "unloaded"}}]})

    async def command(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        body = await request.json()
        self.calls.append(f"{op} {body['model']}")
        if body["model"] != MODEL:
            return web.json_response({"error": {"code": 400, "message": "model not found",
                                                "type": "invalid_request_error"}}, status=400)
        if op == "unload":
            self.steps = [{"value": "loaded"}, {"value": "unloaded"}]
        elif self.load_fails_with is not None:
            self.steps = [{"value": "loading"},
                          {"value": "unloaded", "failed": True,
                           "exit_code": self.load_fails_with}]
        else:
            self.steps = [{"value": "loading"}, {"value": "loading"}, {"value": "loaded"}]
        return web.json_response({"success": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/models", self.models)
        app.router.add_post("/models/{op}", self.command)
        return app


def single_model_server() -> web.Application:
    """``llama-server -m``: lists its one model without a status; no load/unload routes."""
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "model.gguf"}]})
    app = web.Application()
    app.router.add_get("/models", models)
    return app


@pytest.fixture
def pm():
    return make_plugin_manager(load_entry_points=False)


def run(pm, app, hook, options=None, **kw):
    async def scenario():
        async with serve(app) as url:
            return await run_action(pm, hook, ctx("llamacpp", engine_url=url,
                                                  options={"model": MODEL} if options is None
                                                  else options, **kw))
    return asyncio.run(scenario())


def test_unload_then_load_wait_for_the_status(pm):
    router = FakeRouter()
    run(pm, router.app(), "berth_park")
    assert router.calls == [f"unload {MODEL}", "GET /models", "GET /models"]
    assert router.status["value"] == "unloaded"
    router.calls.clear()
    run(pm, router.app(), "berth_wake", room_confirmed=True)
    assert router.calls[:2] == ["GET /models", f"load {MODEL}"]
    assert router.status["value"] == "loaded" and not router.steps


def test_failed_load_carries_the_exit_code(pm):
    router = FakeRouter(status={"value": "unloaded"}, load_fails_with=1)
    with pytest.raises(MechanismError, match=r"loading 'qwen3-8b' failed \(the model's process "
                                             r"exited with 1\)") as e:
        run(pm, router.app(), "berth_wake", room_confirmed=True)
    assert e.value.exit_code == 1


def test_a_stale_failure_before_the_load_is_not_this_loads(pm):
    router = FakeRouter(stale_failure=True)
    run(pm, router.app(), "berth_wake", room_confirmed=True)
    assert router.status["value"] == "loaded"


def test_model_option_is_required_and_checked(pm):
    with pytest.raises(MechanismError, match="needs options.model"):
        run(pm, FakeRouter().app(), "berth_park", options={})
    with pytest.raises(MechanismError, match="answered 400: model not found"):
        run(pm, FakeRouter().app(), "berth_park", options={"model": "nope"})


def test_single_model_server_has_no_park(pm):
    for hook, extra in (("berth_park", {}), ("berth_wake", {"room_confirmed": True})):
        with pytest.raises(MechanismError, match="llama.cpp single-model server has no park; "
                                                 "the ladder drains it"):
            run(pm, single_model_server(), hook, **extra)
    with pytest.raises(MechanismError, match="single-model server has no park"):
        run(pm, web.Application(), "berth_park")   # no /models route at all
