"""Bad input (issue 18, hole 5 and "bad input"): corrupt state files of every shape are moved
aside and berthd starts; a lease entry that cannot be used (a wrong type, a negative size:
issue 26) is refused alone, the rest of the state kept; deeply nested, oversized and loosely typed bodies get a 4xx, never a
5xx; every config error names a key and the value; a config priority is capped at ±1000."""

from __future__ import annotations

import json

import pytest
from berth.config import ConfigError, parse
from berth.daemon import restore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.berthd import Berthd, api, sim_config, wait_for
from tests.faults.conftest import LONG
from tests.helpers import stop_all

# One worker runs the module: its control-API tests share one module-scoped berthd.
pytestmark = pytest.mark.xdist_group("bad_input")

#: State files that parse as TOML (or not at all) but have the wrong shape.
CORRUPT = {
    "leases_string": 'version = 1\nleases = "x"\n',
    "counters_string": 'version = 1\ncounters = "x"\n',
    "baselines_list": 'version = 1\nbaselines = [1, 2]\n',
    "waiting_string": 'version = 1\nwaiting = "x"\n',
    "waiting_bad_kind": 'version = 1\n[[waiting]]\nlease_id = "a"\nkind = "nope"\nsince = 1.0\n',
    "no_version": 'leases = []\n',
    "not_toml": "{{{{",
    "binary": b"\x00\xff\xfe garbage",
    "empty": "",
    "truncated": 'version = 1\n[[leases]]\nid = "a',
    "deep": "version = 1\nx = " + "[" * 3000 + "]" * 3000 + "\n",
}


#: Lease entries that cannot be used: each is refused alone, the rest of the state kept
#: (issue 26: a negative ``size_bytes`` was restored).
_SHARE = '[[leases.shares]]\ncard = "0000:01:00.0"\n'
BAD_LEASES = {
    "lease_id_int": 'id = 1\nengine = "e"\nshares = []\n',
    "lease_shares_string": 'id = "a"\nengine = "e"\nshares = "x"\n',
    "lease_caps_string": 'id = "a"\nengine = "e"\nshares = []\ncaps = 3\n',
    "lease_pid_string": 'id = "a"\nengine = "e"\npid = "1"\nshares = []\n',
    "share_state_bad": f'id = "a"\nengine = "e"\n{_SHARE}size_bytes = 1\nstate = "melted"\n',
    "share_card_int": 'id = "a"\nengine = "e"\n[[leases.shares]]\ncard = 7\nsize_bytes = 1\n'
                      'state = "active"\n',
    "share_size_negative": f'id = "a"\nengine = "e"\n{_SHARE}size_bytes = -5\nstate = "active"\n',
    "share_used_negative": f'id = "a"\nengine = "e"\n{_SHARE}size_bytes = 1\nused_bytes = -1\n'
                           'state = "active"\n',
    "share_parked_float": f'id = "a"\nengine = "e"\n{_SHARE}size_bytes = 1\nparked_bytes = 1.5\n'
                          'state = "parked"\n',
    "lease_need_negative": f'id = "a"\nengine = "e"\nneed_bytes = {{ x = -1 }}\n{_SHARE}'
                           'size_bytes = 1\nstate = "active"\n',
    "share_no_size": f'id = "a"\nengine = "e"\n{_SHARE}state = "active"\n',
}
GOOD_LEASE = f'[[leases]]\nid = "good"\nengine = "g"\n{_SHARE}size_bytes = 1024\nstate = "active"\n'


@pytest.mark.parametrize("name", sorted(BAD_LEASES))
def test_a_bad_lease_entry_is_refused_alone(tmp_path, name, caplog):
    path = tmp_path / "state.toml"
    path.write_text(f"version = 1\n{GOOD_LEASE}[[leases]]\n{BAD_LEASES[name]}")
    loaded = restore.load(path)
    assert loaded.quarantined is None and path.exists(), name
    assert [le.id for le in loaded.snap.leases] == ["good"], name
    assert len(loaded.snap.refused) == 1 and loaded.snap.refused[0].startswith("leases[1]")
    assert "leases[1]" in caplog.text and "the rest of the state kept" in caplog.text
    assert list(tmp_path.glob("state.toml.refused-*")), "the file as it was is kept"


def test_a_negative_size_is_refused_with_a_message_naming_it(tmp_path):
    path = tmp_path / "state.toml"
    path.write_text(f"version = 1\n{GOOD_LEASE}[[leases]]\n{BAD_LEASES['share_size_negative']}")
    refused = restore.load(path).snap.refused
    assert refused == ["leases[1] (id 'a', engine 'e'): shares[0].size_bytes: expected 0 or "
                       "more bytes, got -5"], refused


def test_berthd_restores_the_rest_of_a_state_file_with_a_negative_size(tmp_path):
    import os

    import psutil
    state = tmp_path / "state"
    state.mkdir()
    me = f"owner_pid = {os.getpid()}\nowner_start_time = {psutil.Process().create_time()}\n"
    good = GOOD_LEASE.replace('engine = "g"\n', 'engine = "g"\n' + me)
    bad = BAD_LEASES["share_size_negative"].replace('engine = "e"\n', 'engine = "e"\n' + me)
    (state / "state.toml").write_text(f"version = 1\n{good}[[leases]]\n{bad}")
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "8GiB")])).start()
    try:
        assert [le["id"] for le in d.status()["leases"]] == ["good"]
        assert "shares[0].size_bytes: expected 0 or more bytes, got -5" in d.log.read_text()
    finally:
        d.stop()


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_state_file_is_quarantined(tmp_path, name):
    path = tmp_path / "state.toml"
    raw = CORRUPT[name]
    path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    loaded = restore.load(path)
    assert loaded.snap is None, name
    assert loaded.quarantined is not None and loaded.quarantined.exists()
    assert not path.exists()


def test_directory_in_place_of_the_state_file_is_quarantined(tmp_path):
    path = tmp_path / "state.toml"
    path.mkdir()
    loaded = restore.load(path)
    assert loaded.snap is None and loaded.quarantined.is_dir() and not path.exists()


@pytest.mark.parametrize("shape", ["leases_string", "directory"])
def test_berthd_starts_over_a_corrupt_state_file(tmp_path, shape):
    state = tmp_path / "state"
    state.mkdir()
    if shape == "directory":
        (state / "state.toml").mkdir()
    else:
        (state / "state.toml").write_text(CORRUPT[shape])
    d = Berthd(tmp_path, sim_config(tmp_path, [("gpu0", "8GiB")])).start()
    try:
        assert d.status()["leases"] == []
        assert list(state.glob("state.toml.corrupt-*"))
        wait_for(lambda: (state / "state.toml").is_file(), 10, "a fresh state file")
    finally:
        d.stop()


# -- the control API ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("badinput")
    d = Berthd(tmp, sim_config(tmp, [("gpu0", "8GiB")])).start()
    code, body = d.call("POST", "/v1/leases", {"engine": "fixed", "shares": [{"size": "1GiB"}]})
    assert code == 201, body
    yield d, body["id"]
    stop_all([d.proc], tmp)


@pytest.mark.parametrize("depth", [10, 900, 5000, 100_000])
@pytest.mark.parametrize("path", ["/v1/leases", "/v1/leases/{id}/report", "/v1/operator/park"])
def test_deeply_nested_json_is_a_4xx(live, depth, path):
    d, lid = live
    raw = ('{"engine": ' + "[" * depth + "]" * depth + "}").encode()
    code, body = api(d.sock, "POST", path.format(id=lid), raw=raw)
    assert 400 <= code < 500, (depth, code, body)
    assert body["error"]["type"] != "internal"


@pytest.mark.parametrize("ok", ["yes", "true", 1, 0, None, [], {}])
def test_report_ok_must_be_a_json_bool(live, ok):
    d, lid = live
    code, body = d.call("POST", f"/v1/leases/{lid}/report", {"op": "drain", "ok": ok})
    assert code == 400, body
    assert "ok" in body["error"]["message"]
    assert d.state_of("fixed") == "active"


def test_a_bad_share_size_names_its_field_once(live):
    d, _ = live
    code, body = d.call("POST", "/v1/leases", {"engine": "e", "shares": [{"size": "zz"}]})
    assert code == 400 and body["error"]["message"] == (
        "shares.0.size: expected a size like '24GiB' or '512MiB', got 'zz'"), body


def test_oversized_body_is_a_413(live):
    d, lid = live
    code, body = api(d.sock, "POST", "/v1/leases", raw=b'{"engine": "' + b"x" * (2 << 20) + b'"}')
    assert code == 413, body


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=4), k,
                                                                          max_size=3),
                     max_leaves=8)


@settings(max_examples=60 if LONG else 25, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
       path=st.sampled_from(["/v1/leases", "/v1/leases/{id}", "/v1/leases/{id}/report",
                             "/v1/leases/{id}/attach", "/v1/leases/{id}/release",
                             "/v1/operator/drain", "/v1/operator/x", "/v1/status", "/v1/../x",
                             "/v1/leases/%00", "/" + "a" * 5000]),
       body=_junk, nest=st.integers(0, 3000), pad=st.integers(0, 200_000))
def test_fuzzed_control_api_never_5xx(live, method, path, body, nest, pad):
    d, lid = live
    raw = json.dumps({"op": "park", "ok": True, "pad": "p" * pad, "x": body}).encode()
    raw = raw[:-1] + b', "deep": ' + b"[" * nest + b"]" * nest + b"}"
    try:
        code, answer = api(d.sock, method, path.format(id=lid), raw=raw)
    except ConnectionError:
        code, answer = 0, {}
    assert code == 0 or code < 500, (method, path, code, answer)
    assert d.state_of("fixed") == "active"


# -- config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1001, -1001, 5000, 10**12])
def test_config_priority_is_capped(value):
    with pytest.raises(ConfigError) as e:
        parse({"engines": {"big": {"size": "1GiB", "priority": value}}})
    assert e.value.problems == [("engines.big.priority",
                                 f"expected a priority from -1000 to 1000, got {value}")]


_scalar = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.booleans(),
                    st.floats(allow_nan=False), st.lists(st.integers(), max_size=2))
ENGINE_KEYS = ["size", "priority", "max_priority", "lend", "park", "front", "bound", "card",
               "need", "growth_allowance", "mode", "url"]


@settings(max_examples=120, deadline=None)
@given(entry=st.dictionaries(st.sampled_from(ENGINE_KEYS), _scalar, min_size=1, max_size=4),
       api_=st.dictionaries(st.sampled_from(["operator_group", "max_priority", "tcp"]), _scalar,
                            max_size=2))
def test_fuzzed_config_errors_name_a_key_and_a_value(entry, api_):
    try:
        parse({"engines": {"e": entry}, "api": api_})
    except ConfigError as e:
        for key, msg in e.problems:
            assert key and key != "(top)", (entry, api_, e.problems)
            assert key.split(".")[0] in ("engines", "api"), (key, msg)
            leaf = key.split(".")[-1]
            given_ = entry.get(leaf, api_.get(leaf))
            if leaf in entry or leaf in api_:
                shown = repr(given_)
                assert ("got" in msg or shown in msg or str(given_) in msg
                        or "needs" in msg or "need a front" in msg), (key, msg, given_)
