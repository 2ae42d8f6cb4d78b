"""Huge numbers (issue 36): a lease asking a 300-digit ``growth_allowance`` was granted;
``start_time`` and ``keep_warm`` of 1e400 (infinity) were taken; a 300-digit size reached a 500
with a traceback. Every number from outside is bounded before use (digits, range, finite): a 4xx
naming the field, no traceback. And the uncaught LeaseGone in berthd's log."""

from __future__ import annotations

import asyncio
import gc
import json
import os

import pytest
from berth.config import ConfigError, parse
from berth.daemon.channels import Channel, LeaseGone

from tests.berthd import Berthd, api, sim_config
from tests.helpers import stop_all

pytestmark = pytest.mark.xdist_group("huge_numbers")

BIG = "9" * 300


@pytest.fixture(scope="module")
def berthd(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("huge")
    d = Berthd(tmp, sim_config(tmp, [("gpu0", "24GiB")])).start()
    yield d
    stop_all([d.proc], tmp)


def _lease(**over) -> dict:
    return {"engine": "big", "owner_pid": os.getpid(),
            "shares": [{"card": "gpu0", "size": "1GiB"}], **over}


def _raw(body: dict, **numbers: str) -> bytes:
    """``body`` as JSON with ``numbers`` written as JSON number literals (``1e400``)."""
    text = json.dumps(body)[:-1]
    return (text + "".join(f', "{k}": {v}' for k, v in numbers.items()) + "}").encode()


CASES = [
    ("growth_allowance", {"growth_allowance": int(BIG)}, None),
    ("growth_allowance", {"growth_allowance": BIG + "GiB"}, None),
    ("shares.0.size", {"shares": [{"card": "gpu0", "size": int(BIG)}]}, None),
    ("shares.0.size", {"shares": [{"card": "gpu0", "size": BIG + "GiB"}]}, None),
    ("shares.0.size", {"shares": [{"card": "gpu0", "size": "9" * 400 + "B"}]}, None),
    ("shares.0.need", {"shares": [{"card": "gpu0", "size": "1GiB", "need": int(BIG)}]}, None),
    ("lend_max", {"lend_max": int(BIG)}, None),
    ("start_time", {"pid": os.getpid()}, {"start_time": "1e400"}),
    ("start_time", {"pid": os.getpid()}, {"start_time": "-1e400"}),
    ("keep_warm", {}, {"keep_warm": "1e400"}),
    ("restart_grace", {}, {"restart_grace": "1e400"}),
    ("pid", {"pid": int(BIG)}, None),
    ("owner_pid", {}, {"owner_pid": BIG}),
]


@pytest.mark.parametrize("field,body,raw", CASES,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(CASES)])
def test_a_huge_number_in_a_lease_is_a_4xx_naming_the_field(berthd, field, body, raw):
    before = berthd.log.read_text()
    b = _lease(**body)
    if raw is None:
        status, answer = api(berthd.sock, "POST", "/v1/leases", b)
    else:
        status, answer = api(berthd.sock, "POST", "/v1/leases", raw=_raw(b, **raw))
    assert 400 <= status < 500, (status, answer)
    said = answer["error"]["message"]
    assert field in said, said
    assert len(said) < 600, said                    # the value is not repeated whole
    after = berthd.log.read_text()[len(before):]
    assert "Traceback" not in after, after
    assert not [le for le in berthd.status()["leases"] if le["engine"] == "big"]


def test_a_huge_extension_or_attach_is_a_4xx(berthd):
    status, lease = api(berthd.sock, "POST", "/v1/leases", _lease(engine="ext"))
    assert status == 201, lease
    lid = lease["id"]
    for path, body, field in ((f"/v1/leases/{lid}/extend", {"bytes": int(BIG)}, "bytes"),
                              (f"/v1/leases/{lid}/extend", {"bytes": 1, "to_bytes": int(BIG)},
                               "to_bytes"),
                              (f"/v1/leases/{lid}/attach", {"pid": int(BIG)}, "pid")):
        status, answer = api(berthd.sock, "POST", path, body)
        assert 400 <= status < 500 and field in answer["error"]["message"], (status, answer)
    status, answer = api(berthd.sock, "POST", f"/v1/leases/{lid}/attach",
                         raw=_raw({"pid": os.getpid()}, start_time="1e400"))
    assert 400 <= status < 500 and "start_time" in answer["error"]["message"], answer
    assert "Traceback" not in berthd.log.read_text()


@pytest.mark.parametrize("table,key,value", [
    ("[engines.a]", "keep_warm", "inf"),
    ("[engines.a]", "keep_warm", "1e400"),
    ("[engines.a]", "growth_allowance", f'"{BIG}GiB"'),
    ("[engines.a]", "size", f'"{BIG}GiB"'),
    ("[policy]", "min_turn", "inf"),
    ("[policy]", "ram_budget", f'"{BIG}GiB"'),
    ("[listeners]", "max_connections", str(1 << 62)),
], ids=["keep_warm-inf", "keep_warm-1e400", "growth_allowance", "size", "min_turn-inf",
        "ram_budget", "max_connections"])
def test_a_huge_number_in_berth_toml_is_refused_by_key(table, key, value):
    import tomllib
    data = tomllib.loads(f"{table}\n{key} = {value}\n")
    with pytest.raises(ConfigError) as e:
        parse(data)
    said = str(e.value)
    assert key in said and "Traceback" not in said and len(said) < 800, said


def test_a_lease_gone_while_its_grant_is_polled_is_not_logged_as_never_retrieved():
    """A long poll on the grant (with ``wait_version``) ends on a change of the wait; the lease
    then ends: the shield asyncio made for the poll took the LeaseGone and nobody read it, so
    asyncio logged "Future exception was never retrieved ... LeaseGone" in berthd's log."""
    seen: list[dict] = []

    async def go():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        ch = Channel.new()
        poll = asyncio.create_task(ch.wait_grant(30, lambda: False, wait_version=0))
        await asyncio.sleep(0)
        ch.set_wait("behind B", False)          # the poll returns: the wait changed
        assert await poll is None
        ch.end("L1", "released")                # then the lease ends
        with pytest.raises(LeaseGone):
            await ch.wait_grant(1, lambda: False)
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
    asyncio.run(go())
    gc.collect()
    assert not [c for c in seen if isinstance(c.get("exception"), LeaseGone)], seen
