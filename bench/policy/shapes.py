"""The shapes of issue 24: how users load a card live, as workloads (written beside gen.py's).

    python bench/policy/gen.py            # writes these too (they take no seed)

Each is short and deterministic, and each is also run live by a test with the same parameters
(``tests/run/test_shapes.py``, ``tests/run/test_ping_pong.py``), which checks that the live run
and the simulator agree on the number of switches (within 20 %) and on who is served first:

- ``e-ping-pong``: two 14 GiB engines on one card, both parked by checkpoint, host RAM for
  both; one closed-loop client each, a chat then a 1 s pause, for 90 s. Before issue 24 every
  pause made the holder idle, it yielded at once, and every request paid a park and a restore.
- ``f-fresh-engine``: two models asked together under llama-swap (its health poll every 1 s;
  no park, so the loser is drained): the one granted first must keep its card until the poll
  forwards its request, then each client goes on with short pauses.
- ``g-priority``: L (priority 0) holds with a long job; M (5, a batch job) asks; H (10, a short
  chat) asks 5 s later while L's park waits for its job: H is granted first.
- ``h-client-leaves``: A serves long jobs back to back past its turn; B's client asks for B
  (parked) and leaves before A's park could begin: the park is called off.
- ``i-unfreeable``: a ComfyUI-like engine that nobody can stop and that has no park
  (``--highvram``) holds 12 GiB; a 14 GiB chat model can never have the card (503 at once),
  an 8 GiB one fits beside it.

Cards: one 24 GiB card with the 1 GiB reserve gen.py uses; host RAM 64 GiB; the mechanisms'
default costs (:class:`~.workload.Mechanisms`).
"""

from __future__ import annotations

from .workload import CardSpec, ClientSpec, EngineSpec, GiB, Mechanisms, RequestSpec, Workload

__all__ = ["SHAPES", "build_shapes", "PCI", "ENGINE_GIB", "LOADED_GIB"]

PCI = "0000:01:00.0"
CARD = CardSpec(PCI, "gpu0", 24 * GiB, 1 * GiB)
#: The engines' declared size and what a load allocates: the stub engine's 13 GiB of weights
#: and its 256 MiB context.
ENGINE_GIB, LOADED_GIB = 14.0, 13.25
CHAT_S = 0.05        # a short chat (the stub engine's few tokens)


def _engine(name: str, size_gib: float = ENGINE_GIB, base_gib: float = LOADED_GIB,
            **kw) -> EngineSpec:
    return EngineSpec(name=name, size_bytes={PCI: int(size_gib * GiB)},
                      base_bytes={PCI: int(base_gib * GiB)}, slots=4, **kw)


def _wl(name: str, description: str, duration_s: float, engines, requests=(), clients=(),
        params: dict | None = None) -> Workload:
    return Workload(name=name, description=description, seed=0, duration_s=duration_s,
                    host_ram_bytes=64 * GiB, cards=(CARD,), engines=tuple(engines),
                    requests=tuple(RequestSpec(*r) for r in requests),
                    mechanisms=Mechanisms(), generator={"shape": "issue 24", **(params or {})},
                    clients=tuple(clients)).validate()


def ping_pong() -> Workload:
    """Both engines loaded first (A, then B, which parks A), then 90 s of two busy clients."""
    start, run_s, pause_s = 30.0, 90.0, 1.0
    clients = [ClientSpec(e, start, start + run_s, pause_s, CHAT_S) for e in ("A", "B")]
    return _wl("e-ping-pong", "Two 14 GiB engines on one card, both parked by checkpoint; one "
               "client each sends a chat then pauses 1 s, for 90 s (issue 24).", start + run_s,
               [_engine("A"), _engine("B")], [(0.0, "A", CHAT_S, 0, 0.0),
                                              (15.0, "B", CHAT_S, 0, 0.0)], clients,
               {"run_s": run_s, "pause_s": pause_s, "clients_start_s": start})


def fresh_engine() -> Workload:
    """Two models asked together under llama-swap, no park; each client then goes on."""
    until_s, pause_s = 60.0, 1.0
    # B asks 0.3 s after A: together for llama-swap (inside one health poll), in one order.
    clients = [ClientSpec(e, t, until_s, pause_s, CHAT_S) for e, t in (("A", 0.0), ("B", 0.3))]
    return _wl("f-fresh-engine", "Two 14 GiB models without a park asked together under "
               "llama-swap (its health poll: 0.25 s, then every 1 s); each client then sends a "
               "chat 1 s after each answer until 60 s (issue 24).", until_s, [
                   _engine("A", park=None), _engine("B", park=None)], clients=clients,
               params={"pause_s": pause_s, "until_s": until_s})


def priority() -> Workload:
    """L holds with a long job; M (batch) asks; H (chat) asks 5 s later while L's park waits."""
    engines = [_engine("L"), _engine("M", priority=5), _engine("H", priority=10, keep_warm_s=5.0)]
    reqs = [(0.0, "L", 30.0, 0, 0.0), (20.0, "M", 20.0, 0, 0.0), (25.0, "H", 1.0, 0, 0.0)]
    return _wl("g-priority", "L (priority 0) serves a 30 s job; M (priority 5) asks for a 20 s "
               "batch job; H (priority 10, keep_warm 5 s) asks for a 1 s chat 5 s later, while "
               "L's park waits for its job (issue 24).", 120.0, engines, reqs,
               params={"m_asks_s": 20.0, "h_asks_s": 25.0})


def client_leaves() -> Workload:
    """A serves a long job past its turn; B's client asks (B is parked) and leaves while A's
    park waits for a job that came after B asked."""
    asks, leaves = 95.0, 25.0
    reqs = [(0.0, "A", CHAT_S, 0, 0.0), (30.0, "B", CHAT_S, 0, 0.0), (70.0, "A", 35.0, 0, 0.0),
            (asks, "B", CHAT_S, 0, 0.0, "chat", leaves), (100.0, "A", 30.0, 0, 0.0)]
    clients = [ClientSpec("A", 70.0, 140.0, 1.0, CHAT_S)]
    return _wl("h-client-leaves", "A, then B load (A parks for B); from 70 s A serves a 35 s "
               "job and a client's chats (1 s pauses) until 140 s; at 95 s B's client asks for "
               "B and leaves 25 s later, while A's park waits for a 30 s job that came at 100 s "
               "(issue 24).", 160.0, [_engine("A"), _engine("B")], reqs, clients,
               {"b_asks_s": asks, "b_leaves_after_s": leaves})


def unfreeable() -> Workload:
    """ComfyUI with --highvram holds 12 GiB; a 14 GiB chat never fits, an 8 GiB one does."""
    engines = [_engine("comfy", 12.0, 11.0, park=None, drain=False,
                       note="in-process host: no park (--highvram), never stopped"),
               _engine("chat-14"), _engine("chat-8", 8.0, 6.5)]
    reqs = [(0.0, "comfy", 20.0, 0, 0.0, "image"), (30.0, "chat-14", 2.0, 0, 0.0),
            (31.0, "chat-8", 2.0, 0, 0.0), (60.0, "chat-14", 2.0, 0, 0.0),
            (61.0, "chat-8", 2.0, 0, 0.0), (70.0, "comfy", 20.0, 0, 0.0, "image")]
    return _wl("i-unfreeable", "A ComfyUI-like engine that nobody can stop and that has no park "
               "(--highvram) holds 12 GiB; a 14 GiB chat model can never have the card, an "
               "8 GiB one fits beside it (issue 24).", 100.0, engines, reqs)


SHAPES = {"e-ping-pong": ping_pong, "f-fresh-engine": fresh_engine, "g-priority": priority,
          "h-client-leaves": client_leaves, "i-unfreeable": unfreeable}


def build_shapes() -> dict[str, Workload]:
    """Every shape's workload, by name."""
    return {name: make() for name, make in SHAPES.items()}
