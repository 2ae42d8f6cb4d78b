"""The SGLang plugin against a small server speaking SGLang's memory routes as the reference
describes them (reference/park-mechanisms.md "SGLang"): 200 on success, 400
``{"error": {"message": …}}`` on an exception, the admin key as a Bearer token."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from berth_plugins.hookspecs import MechanismError
from berth_plugins.manager import make_plugin_manager, run_action

from .conftest import ctx, serve

ROUTES = ("/pause_generation", "/release_memory_occupation", "/resume_memory_occupation",
          "/continue_generation")


class FakeSGLang:
    """Records each call with its JSON body. ``released`` is only a flag: a release answers 200
    while the memory may stay charged (radixark/miles PR #86), so the plugin must not claim more."""

    def __init__(self, admin_key: str | None = None, old_build: bool = False,
                 release_error: str | None = None):
        self.admin_key, self.old_build, self.release_error = admin_key, old_build, release_error
        self.calls: list[tuple[str, dict]] = []
        self.released = False

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        if self.old_build and path in ("/pause_generation", "/continue_generation"):
            return web.json_response({"detail": "Not Found"}, status=404)
        if self.admin_key and request.headers.get("Authorization") != f"Bearer {self.admin_key}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        body = await request.json()
        self.calls.append((path, body))
        if path == "/release_memory_occupation":
            if self.release_error:
                return web.json_response({"error": {"message": self.release_error}}, status=400)
            self.released = True
        if path == "/resume_memory_occupation":
            self.released = False
        return web.json_response({"success": True, "message": ""})

    def app(self) -> web.Application:
        app = web.Application()
        for route in ROUTES:
            app.router.add_post(route, self.handle)
        return app


@pytest.fixture
def pm():
    return make_plugin_manager(load_entry_points=False)


def run(pm, fake, hook, **kw):
    async def scenario():
        async with serve(fake.app()) as url:
            return await run_action(pm, hook, ctx("sglang", engine_url=url, **kw))
    return asyncio.run(scenario())


def test_park_and_wake_with_the_admin_key(pm):
    fake = FakeSGLang(admin_key="s3cret")
    assert run(pm, fake, "berth_park", options={"admin_key": "s3cret"}) is None
    assert fake.calls == [("/pause_generation", {"mode": "abort"}),
                          ("/release_memory_occupation", {})]
    assert fake.released   # the fake only flagged it; freed-ness is the driver's to show
    fake.calls.clear()
    run(pm, fake, "berth_wake", options={"admin_key": "s3cret"}, room_confirmed=True)
    assert fake.calls == [("/resume_memory_occupation", {}), ("/continue_generation", {})]


def test_missing_admin_key_is_named(pm):
    with pytest.raises(MechanismError, match="answered 401: Unauthorized.*set admin_key"):
        run(pm, FakeSGLang(admin_key="s3cret"), "berth_park")


def test_old_build_without_pause_is_tolerated(pm):
    fake = FakeSGLang(old_build=True)
    run(pm, fake, "berth_park")
    assert fake.calls == [("/release_memory_occupation", {})]
    fake.calls.clear()
    run(pm, fake, "berth_wake", room_confirmed=True)
    assert fake.calls == [("/resume_memory_occupation", {})]


def test_release_error_quotes_sglang_and_continues_generation(pm):
    fake = FakeSGLang(release_error="AssertionError: there are running requests")
    with pytest.raises(MechanismError, match="release_memory_occupation answered 400: "
                                             "AssertionError: there are running requests"):
        run(pm, fake, "berth_park")
    assert [p for p, _ in fake.calls] == ["/pause_generation", "/release_memory_occupation",
                                          "/continue_generation"]
