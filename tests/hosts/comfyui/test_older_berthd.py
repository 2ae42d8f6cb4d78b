"""The node against an older berthd (the node and berthd can come from different installs): an
extension request whose newer field berthd does not take is answered 400 "<field>: unknown key"
(berthd's own words for a field it does not know), and the node asks again without that field,
as it asked before there was one, instead of refusing the prompt. Real HTTP over a Unix socket
to an aiohttp stand-in that keeps an older berthd's fields."""

from __future__ import annotations

import asyncio
import types

from aiohttp import web
from berth.client import Client
from berth_hosts.comfyui.reservation import Reservation

#: The extension request's fields before ``to_bytes`` (issue 34 added ``client``; the flake of
#: ``test_unfreeable`` added ``to_bytes``).
OLDER_FIELDS = {"bytes", "card", "client", "client_age_s"}


async def _ask_an_older_berthd(tmp_path, fields: set[str], status: int = 400) -> tuple:
    asked: list[dict] = []

    async def extend(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body)
        unknown = sorted(set(body) - fields)
        if unknown:
            return web.json_response({"error": {"type": "invalid_request", "code": status,
                                                "message": f"{unknown[0]}: unknown key"},
                                      "src": "berthd"}, status=status)
        return web.json_response({"id": "L1", "card": "gpu0", "reserved_bytes": 1,
                                  "waiting": True}, status=202)

    app = web.Application()
    app.router.add_post("/v1/leases/{lid}/extend", extend)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = tmp_path / "berthd.sock"
    await web.UnixSite(runner, str(sock)).start()
    node = Reservation()
    node.card = "gpu0"
    node.gate = types.SimpleNamespace(asker=lambda: ("k1", 0.5))
    node._client = Client(socket=sock)
    try:
        said = await node._ask_room("L1", 5 << 30, 12 << 30)
    finally:
        await node._client.close()
        await runner.cleanup()
    return said, asked


def test_an_older_berthd_that_does_not_take_to_bytes_is_asked_again_without_it(tmp_path):
    said, asked = asyncio.run(_ask_an_older_berthd(tmp_path, OLDER_FIELDS))
    assert said is None, said                     # asked: the prompt waits for its room
    assert [sorted(b) for b in asked] == [
        ["bytes", "card", "client", "client_age_s", "to_bytes"],
        ["bytes", "card", "client", "client_age_s"]], asked
    assert asked[1]["bytes"] == 5 << 30


def test_a_berthd_older_still_is_asked_with_bytes_and_card_only(tmp_path):
    said, asked = asyncio.run(_ask_an_older_berthd(tmp_path, {"bytes", "card"}))
    assert said is None, said
    assert sorted(asked[-1]) == ["bytes", "card"] and len(asked) == 4, asked


def test_a_refusal_for_another_reason_is_said_not_retried(tmp_path):
    said, asked = asyncio.run(_ask_an_older_berthd(tmp_path, OLDER_FIELDS, status=409))
    assert said == "berthd refused the extension: to_bytes: unknown key", said
    assert len(asked) == 1, asked
