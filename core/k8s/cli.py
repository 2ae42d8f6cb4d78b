"""``berth k8s``: the node agent's first pieces (issue 39; docs/scale.md).

- ``berth k8s lease FILE…`` (``-`` reads stdin): every allocated ResourceClaim in the files
  (as ``kubectl get resourceclaims,resourceslices -o yaml`` prints them, the node's slices
  beside the claims) becomes one lease at berthd, a share per card of its
  ``consumedCapacity.memory`` (:mod:`berth.k8s.claims`). The command holds the leases until it
  is stopped (Ctrl-C, SIGTERM, SIGHUP), then releases them: their lives follow its own, as a run's
  follow ``berth run``. ``--plan`` prints the leases and makes none.
- ``berth k8s slices``: the ResourceSlice Berth would publish for this node's cards, read from
  the driver berth.toml configures (simulated cards or NVML; :mod:`berth.k8s.slices`).

Bad input ends with exit 2 and one line naming the object, the field and the value; berthd
unreachable or refusing ends with exit 1 and its words. No traceback reaches the user.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys

from berth import startup

from .claims import BERTH_DRIVER, GPU_DRIVERS, engine_name

__all__ = ["arguments"]


def arguments(p: argparse.ArgumentParser) -> None:
    """Fill ``berth k8s``'s parser (:data:`berth.cli.COMMANDS`)."""
    p.description = ("Berth as Kubernetes' node agent: hold the leases of allocated "
                     "ResourceClaims, print the ResourceSlice of this node's cards "
                     "(docs/scale.md).")
    sub = p.add_subparsers(dest="k8s_command", metavar="K8S_COMMAND", required=True)
    q = sub.add_parser("lease", help="hold a lease for each allocated ResourceClaim given")
    q.add_argument("files", nargs="+", metavar="FILE",
                   help="ResourceClaims (resource.k8s.io/v1) and this node's ResourceSlices, "
                        "JSON or YAML, as the API serves them; - reads stdin")
    q.add_argument("--node", help="this node's name: claims allocated on other nodes are left "
                                  "alone, and a device whose slice is another node's is refused "
                                  "(default: not checked)")
    q.add_argument("--driver", action="append", metavar="NAME",
                   help=f"a GPU driver whose devices are read (repeatable; default "
                        f"{', '.join(GPU_DRIVERS)})")
    q.add_argument("--plan", action="store_true",
                   help="print the leases against berthd's cards and make none")
    q.set_defaults(func=_lease)
    startup.keep_paused(q)          # its run says started() once its modules are loaded
    s = sub.add_parser("slices", help="print the ResourceSlice Berth would publish for "
                                      "this node's cards")
    s.add_argument("--node", help="the node's name (default: this host's name)")
    s.add_argument("--driver", default=BERTH_DRIVER, help=f"driver name (default {BERTH_DRIVER})")
    s.add_argument("--json", action="store_true", help="JSON instead of YAML")
    s.add_argument("--config", help="berth.toml (default: the one berthd reads)")
    s.set_defaults(func=_slices)
    startup.keep_paused(s)          # one print, then it exits


def _fail(message: str, code: int) -> int:
    print(f"berth k8s: {message}", file=sys.stderr)
    return code


def _lease(args) -> int:
    from .objects import K8sInputError, K8sMissing, load
    try:
        loaded = load(args.files)
    except (K8sInputError, K8sMissing) as e:
        return _fail(str(e), 2)
    if not loaded.claims:
        return _fail(f"no ResourceClaim (resource.k8s.io/v1) in {', '.join(args.files)}"
                     + (f"; found {', '.join(loaded.other)}" if loaded.other else ""), 2)
    try:
        return asyncio.run(_lease_async(args, loaded))
    except KeyboardInterrupt:          # before the handlers were set: nothing is held
        return 130


async def _lease_async(args, loaded) -> int:
    from berth.client import ApiError, BerthdUnavailable, Client

    from .claims import plan
    from .objects import K8sInputError
    startup.started()                   # its modules are loaded: collect again
    drivers = tuple(args.driver) if args.driver else GPU_DRIVERS
    async with Client() as client:
        try:
            cards = (await client.status())["cards"]
        except (BerthdUnavailable, ApiError) as e:
            return _fail(str(e), 1)
        mine, elsewhere = _on_node(loaded.claims, args.node)
        for w, nodes in elsewhere:
            print(f"left alone: {w} is allocated on {', '.join(nodes)}, not this node")
        if not mine:
            return _fail(f"no claim given is allocated on this node ({args.node!r}): "
                         + "; ".join(f"{w} is on {', '.join(repr(n) for n in nodes)}"
                                     for w, nodes in elsewhere), 2)
        try:
            plans = [plan(w, claim, loaded.slices, cards, args.node, drivers)
                     for w, claim in mine]
        except K8sInputError as e:
            return _fail(str(e), 2)
        for p in plans:
            print(f"claim {p.words()}" + "".join(f"\n  left alone: {s}" for s in p.skipped))
        if args.plan:
            return 0
        return await _hold(client, plans)


#: The signals that release the leases and end ``berth k8s lease``, exit 0. SIGHUP too: an agent
#: started from a terminal gets it when the terminal closes, and its default action killed the
#: agent without releasing its leases.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def _hold(client, plans: list) -> int:
    """Request every plan's lease, wait for the grants, hold them until SIGINT, SIGTERM or
    SIGHUP (:data:`STOP_SIGNALS`), then release them (also when stopped while a lease still
    waits)."""
    from berth.client import ApiError, BerthdUnavailable
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    held: list[str] = []
    try:
        for p in plans:
            r = await client.request_lease(p.body(os.getpid()))
            held.append(r["id"])
            print(f"lease {r['id']} for {engine_name(p.claim)}: {r['state']}", flush=True)
        for lid in held:
            granted = await _unless(stop, _granted(client, lid))
            if granted is None:
                print(f"stopped while lease {lid} waited", flush=True)
                return 0
            if not granted:
                return _fail(f"lease {lid} ended before its grant (see berthd's log)", 1)
        print(f"holding {len(held)} lease{'s' if len(held) != 1 else ''} until stopped "
              f"(Ctrl-C, SIGTERM or SIGHUP releases them)", flush=True)
        await stop.wait()
    except (BerthdUnavailable, ApiError) as e:
        return _fail(str(e), 1)
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        await _release(client, held)
    return 0


async def _unless(stop: asyncio.Event, coro):
    """``coro``'s result, or ``None`` when ``stop`` is set first (``coro`` is then cancelled)."""
    task = asyncio.ensure_future(coro)
    halt = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, halt}, return_when=asyncio.FIRST_COMPLETED)
    for t in (task, halt):
        if t not in done:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    return task.result() if task in done else None


def _on_node(claims: list, node: str | None) -> tuple[list, list]:
    """``claims`` split into those for this node (all of them when ``node`` is unknown) and
    ``[(where, nodes)]`` of those allocated on other nodes (another agent's)."""
    from .claims import allocated_nodes
    if not node:
        return list(claims), []
    mine, elsewhere = [], []
    for w, claim in claims:
        nodes = allocated_nodes(claim)
        if nodes is not None and node not in nodes:
            elsewhere.append((w, nodes))
        else:
            mine.append((w, claim))
    return mine, elsewhere


async def _granted(client, lid: str) -> bool:
    """Wait for lease ``lid``'s grant (berthd's long poll, again and again); prints it.
    ``False``: the lease ended first."""
    from berth.client import ApiError
    from berth.decide.units import format_size
    while True:
        try:
            g = await client.wait_grant(lid, 20.0)
        except ApiError as e:
            if e.status in (404, 410):
                return False
            raise
        if g.get("granted"):
            print(f"lease {lid} granted: " + ", ".join(
                f"{c['name']} ({c.get('uuid')}) {format_size(c['bytes'])}" for c in g["cards"])
                + f" ({g.get('rung')})", flush=True)
            return True
        why = (g.get("wait") or {}).get("why")
        if why:
            print(f"lease {lid} waits: {why}", flush=True)


async def _release(client, held: list[str]) -> None:
    from berth.client import ApiError, BerthdUnavailable
    for lid in held:
        with contextlib.suppress(BerthdUnavailable, ApiError):
            await client.release(lid, 0, "berth k8s lease stopped")
            print(f"lease {lid} released", flush=True)


def _slices(args) -> int:
    from berth.config import ConfigError, load_config
    from berth.daemon.main import open_driver
    from berth.driver.base import DriverError

    from .objects import K8sInputError, K8sMissing
    from .slices import build
    try:
        cfg, _ = load_config(args.config)
        driver = open_driver(cfg)
        try:
            infos = driver.cards()
        finally:
            driver.close()
    except ConfigError as e:
        return _fail(str(e), 2)
    except DriverError as e:
        return _fail(f"cannot read the cards: {e}", 1)
    declared = {c.pci: c.name for c in cfg.driver.cards}
    cards = []
    for i, info in enumerate(infos):
        name = declared.get(info.pci, f"gpu{i}")
        cc = cfg.card_config(info.pci, name)
        cards.append((info, name, info.total_bytes - cc.reserve - sum(cc.claims.values())))
    node = (args.node or os.uname().nodename).lower()
    try:
        _, body = build(node, args.driver, cards)
    except (K8sInputError, K8sMissing) as e:
        return _fail(str(e), 2)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        import yaml
        print(yaml.safe_dump(body, sort_keys=False), end="")
    return 0
