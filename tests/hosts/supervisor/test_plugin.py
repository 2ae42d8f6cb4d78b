"""The ownership hook and berthd's adoption of a running process (issue 7): the plugin vouches
only for the PID and start time supervisord reports; an adopted process's memory is its own at
admission; a process that does not fit runs over budget, and the board says so."""

from __future__ import annotations

import asyncio

import psutil
from aiohttp.test_utils import TestClient, TestServer
from berth.config import parse
from berth.daemon.api import make_app
from berth.daemon.broker import Broker
from berth.sim.driver import SimDriver
from berth_hosts.supervisor import plugin
from berth_hosts.supervisor.rpc import ProcessInfo, SupervisorError

from berth_plugins.hookspecs import hookimpl
from berth_plugins.manager import make_plugin_manager

from ...sim.conftest import PCI, kit  # noqa: F401  (kit is a fixture)


class FakeSupervisor:
    """Answers ``info`` from a table; an unknown name is supervisord's BAD_NAME fault."""

    def __init__(self, **procs: ProcessInfo):
        self.procs = procs

    def info(self, name: str) -> ProcessInfo:
        if name not in self.procs:
            raise SupervisorError(f"getProcessInfo({name!r})", 10, f"BAD_NAME: {name}")
        return self.procs[name]


def running(pid: int, start: int) -> ProcessInfo:
    return ProcessInfo(name="p", group="p", pid=pid, start=start, state=20, statename="RUNNING")


def test_vouches_only_for_the_pid_and_start_supervisord_reports():
    sup = FakeSupervisor(p=running(100, 1_700_000_000))
    assert plugin.vouches(sup, "p", 100, 1_700_000_000.73)        # start is whole seconds
    assert not plugin.vouches(sup, "p", 101, 1_700_000_000.0)     # another process
    assert not plugin.vouches(sup, "p", 100, 1_700_000_009.0)     # a reused PID
    assert not plugin.vouches(sup, "q", 100, 1_700_000_000.0)     # no such program


def test_berth_vouch_abstains_for_other_hosts_and_refuses_unmapped_engines(monkeypatch):
    monkeypatch.setattr(plugin, "_state", {"supervisor": None, "programs": {}})
    plugin.configure(parse({"engines": {"e": {"supervisor": "p", "size": "1GiB"}},
                            "hosts": {"supervisor": {"url": "unix:///nonexistent.sock"}}}))
    assert plugin.programs() == {"e": "p"}
    assert plugin.berth_vouch(1, 0.0, "e", "llama-swap") is None
    assert plugin.berth_vouch(1, 0.0, "other", "supervisor") is False
    assert plugin.berth_vouch(1, 0.0, "e", "supervisor") is False   # supervisord unreachable


class _TestHost:
    """A host plugin that vouches for the PIDs it was given (stands in for supervisord)."""

    def __init__(self, pids):
        self.pids = set(pids)

    @hookimpl
    def berth_vouch(self, pid, start_time, engine, host):
        return (pid in self.pids) if host == "test" else None


def test_adopted_process_counts_its_own_memory_and_runs_over_budget_visibly(kit, tmp_path):  # noqa: F811
    big = kit.start(weights="20GiB")              # 20.25 GiB with its context
    small = kit.start(weights="1GiB")             # 1.25 GiB; 2.5 GiB of the card stay free
    cfg = parse({"driver": {"kind": "sim", "sim_dir": str(kit.dir),
                            "cards": [{"pci": PCI, "name": "gpu0", "total": "24GiB"}]},
                 "cards": {"gpu0": {"reserve": "512MiB", "baseline": "0"}},
                 "policy": {"read_interval": "0.1s", "min_turn": "300s"},
                 "engines": {"big": {"size": "21GiB"}, "small": {"size": "3584MiB"}}})
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(_TestHost({big.pid, small.pid}))

    async def go():
        broker = Broker(cfg, SimDriver(kit.dir), tmp_path / "state.toml", pm)
        await broker.start()
        try:
            async with TestClient(TestServer(make_app(broker))) as c:   # TCP: no peer creds
                # Without its process, 21 GiB does not fit in what the driver shows free.
                r = await c.post("/v1/leases", json={"engine": "plain", "shares": [
                    {"card": "gpu0", "size": "21GiB"}]})
                assert (await r.json())["state"] == "waiting"
                await c.post("/v1/operator/drain", json={"target": "plain"})
                # Claiming a process nobody vouches for is refused, naming why.
                r = await c.post("/v1/leases", json={"engine": "big", "pid": big.pid})
                assert r.status == 403 and "no plugin vouches" in (await r.json())["error"][
                    "message"]
                # Adopted: born attached, its 20.25 GiB are its own, so 21 GiB fit.
                r = await c.post("/v1/leases", json={"engine": "big", "pid": big.pid,
                                                     "host": "test"})
                body = await r.json()
                assert r.status == 201 and body["state"] == "active", body
                le = next(x for x in broker.status()["leases"] if x["engine"] == "big")
                assert le["pid"] == big.pid
                assert abs(le["start_time"] - psutil.Process(big.pid).create_time()) < 0.05
                # The small one does not fit beside it: its lease waits while it runs.
                r = await c.post("/v1/leases", json={"engine": "small", "pid": small.pid,
                                                     "host": "test"})
                assert (await r.json())["state"] == "waiting"
                for _ in range(100):            # a few driver reads settle the stowaways
                    st = broker.status()
                    if st["cards"][0]["stowaway_bytes"] == 1280 << 20:
                        break
                    await asyncio.sleep(0.05)
                w = next(x for x in st["waiting"] if x["engine"] == "small")
                assert w["running"] and w["pid"] == small.pid and w["held_bytes"] == 1280 << 20
                assert "over budget" in w["note"]
                assert st["cards"][0]["stowaway_bytes"] == 1280 << 20   # not granted: a stowaway
        finally:
            await broker.stop()
    asyncio.run(go())
