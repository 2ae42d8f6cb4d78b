"""The shapes users make live, as short workloads (written beside gen.py's seeded ones).

    python bench/policy/gen.py              # the committed files: issue 24's shapes with their
                                            # own parameters, issue 34's from seed 8
    python bench/policy/gen.py --seed 3     # every shape drawn from seed 3

A shape is a situation, not a trace: each builder takes a ``random.Random`` and draws its
parameters (times, pauses, job lengths) from ranges; with ``rng=None`` issue 24's shapes take
the parameters their live tests were written with (``tests/run/test_shapes.py``,
``tests/run/test_ping_pong.py``, ``tests/hosts/comfyui/test_unfreeable.py``), which check that
the live run and the simulator agree on the number of switches (within 20 %) and on who is
served first. Issue 24's shapes:

- ``e-ping-pong``: two 14 GiB engines on one card, both parked by checkpoint, host RAM for
  both; one closed-loop client each, a chat then a short pause.
- ``f-fresh-engine``: two models asked together under llama-swap (its health poll every 1 s;
  no park, so the loser is drained): the one granted first must keep its card until the poll
  forwards its request, then each client goes on with short pauses.
- ``g-priority``: L (priority 0) holds with a long job; M (5, a batch job) asks; H (10, a short
  chat) asks a few seconds later while L's park waits for its job: H is granted first.
- ``h-client-leaves``: A serves long jobs back to back past its turn; B's client asks for B
  (parked) and leaves before A's park could begin: the park is called off.
- ``i-unfreeable``: a ComfyUI-like engine that nobody can stop and that has no park
  (``--highvram``) holds 12 GiB; a 14 GiB chat model can never have the card (503 at once),
  an 8 GiB one fits beside it.

Issue 34's, each a closed-loop client that moves between engines (the next request leaves
only after the last answer; :class:`~.workload.ClientSpec`), a few minutes long so that each
also runs live (``tests/run/test_shapes.py``):

- ``j-alternate-two``: one client, A, B, A, B, ... on two 14 GiB engines that do not fit
  together (llama-swap's everyday use), short think times.
- ``k-alternate-three``: the same over three engines, A, B, C, A, ...
- ``l-think-times``: one client choosing A or B at random (weights drawn) with think times
  from 0 to 30 s: whether a holder's client comes back within a switch's cost varies.
- ``m-busy-beside``: a busy client on A (short pauses) beside a client alternating A and B.
- ``n-comfy-chats``: a ComfyUI-like queue (one slot, grows and keeps it) of image jobs
  submitted in batches, beside a client alternating two chat models that fit together.
- ``o-bursty-ping-pong``: one client per engine, each sending bursts of 3-6 requests back to
  back, then reading 3-25 s: a long turn for one side starves the other's bursts.

Cards: one 24 GiB card with the 1 GiB reserve gen.py uses; host RAM 64 GiB; the mechanisms'
default costs (:class:`~.workload.Mechanisms`).
"""

from __future__ import annotations

import random

from .workload import CardSpec, ClientSpec, EngineSpec, GiB, Mechanisms, RequestSpec, Workload

__all__ = ["SHAPES", "ISSUE_24", "build_shapes", "PCI", "ENGINE_GIB", "LOADED_GIB"]

PCI = "0000:01:00.0"
CARD = CardSpec(PCI, "gpu0", 24 * GiB, 1 * GiB)
#: The engines' declared size and what a load allocates: the stub engine's 13 GiB of weights
#: and its 256 MiB context.
ENGINE_GIB, LOADED_GIB = 14.0, 13.25
CHAT_S = 0.05        # a short chat (the stub engine's few tokens)


def _engine(name: str, size_gib: float = ENGINE_GIB, base_gib: float = LOADED_GIB,
            **kw) -> EngineSpec:
    return EngineSpec(name=name, size_bytes={PCI: int(size_gib * GiB)},
                      base_bytes={PCI: int(base_gib * GiB)}, **{"slots": 4, **kw})


def _wl(name: str, description: str, duration_s: float, engines, requests=(), clients=(),
        params: dict | None = None, seed: int = 0, issue: int = 24) -> Workload:
    return Workload(name=name, description=description, seed=seed, duration_s=duration_s,
                    host_ram_bytes=64 * GiB, cards=(CARD,), engines=tuple(engines),
                    requests=tuple(RequestSpec(*r) for r in requests),
                    mechanisms=Mechanisms(),
                    generator={"shape": f"issue {issue}", **(params or {})},
                    clients=tuple(clients)).validate()


def _draw(rng: random.Random | None, canonical: float, lo: float, hi: float,
          digits: int = 1) -> float:
    """``canonical`` without a generator, else uniform in ``[lo, hi]`` (rounded: the files stay
    readable and the live tests' parameters exact)."""
    return canonical if rng is None else round(rng.uniform(lo, hi), digits)


def _seed(rng: random.Random | None) -> int:
    return 0 if rng is None else rng.randrange(1 << 30)


def ping_pong(rng: random.Random | None = None) -> Workload:
    """Both engines loaded first (A, then B, which parks A), then two busy clients."""
    start = 30.0
    run_s, pause_s = _draw(rng, 90.0, 60, 120, 0), _draw(rng, 1.0, 0.3, 2.0)
    clients = [ClientSpec(e, start, start + run_s, pause_s, CHAT_S) for e in ("A", "B")]
    return _wl("e-ping-pong", "Two 14 GiB engines on one card, both parked by checkpoint; one "
               f"client each sends a chat then pauses {pause_s:g} s, for {run_s:g} s (issue 24).",
               start + run_s,
               [_engine("A"), _engine("B")], [(0.0, "A", CHAT_S, 0, 0.0),
                                              (15.0, "B", CHAT_S, 0, 0.0)], clients,
               {"run_s": run_s, "pause_s": pause_s, "clients_start_s": start}, _seed(rng))


def fresh_engine(rng: random.Random | None = None) -> Workload:
    """Two models asked together under llama-swap, no park; each client then goes on."""
    until_s, pause_s = _draw(rng, 60.0, 45, 90, 0), _draw(rng, 1.0, 0.3, 2.0)
    # B asks a fraction of a second after A: together for llama-swap (inside one health poll).
    b_s = _draw(rng, 0.3, 0.05, 0.9, 2)
    clients = [ClientSpec(e, t, until_s, pause_s, CHAT_S) for e, t in (("A", 0.0), ("B", b_s))]
    return _wl("f-fresh-engine", "Two 14 GiB models without a park asked together under "
               "llama-swap (its health poll: 0.25 s, then every 1 s); each client then sends a "
               f"chat {pause_s:g} s after each answer until {until_s:g} s (issue 24).", until_s, [
                   _engine("A", park=None), _engine("B", park=None)], clients=clients,
               params={"pause_s": pause_s, "until_s": until_s, "b_asks_s": b_s},
               seed=_seed(rng))


def priority(rng: random.Random | None = None) -> Workload:
    """L holds with a long job; M (batch) asks; H (chat) asks later while L's park waits."""
    engines = [_engine("L"), _engine("M", priority=5), _engine("H", priority=10, keep_warm_s=5.0)]
    l_s, m_at, m_s = _draw(rng, 30.0, 25, 40), _draw(rng, 20.0, 14, 22), _draw(rng, 20.0, 10, 30)
    h_at = m_at + _draw(rng, 5.0, 2, 8)
    reqs = [(0.0, "L", l_s, 0, 0.0), (m_at, "M", m_s, 0, 0.0), (h_at, "H", 1.0, 0, 0.0)]
    return _wl("g-priority", f"L (priority 0) serves a {l_s:g} s job; M (priority 5) asks for a "
               f"{m_s:g} s batch job at {m_at:g} s; H (priority 10, keep_warm 5 s) asks for a 1 s "
               f"chat at {h_at:g} s, while L's park waits for its job (issue 24).", 120.0,
               engines, reqs, params={"m_asks_s": m_at, "h_asks_s": h_at}, seed=_seed(rng))


def client_leaves(rng: random.Random | None = None) -> Workload:
    """A serves a long job past its turn; B's client asks (B is parked) and leaves while A's
    park waits for a job that came after B asked."""
    job_s, asks = _draw(rng, 35.0, 30, 45), _draw(rng, 95.0, 88, 98)
    leaves, second = _draw(rng, 25.0, 15, 30), asks + _draw(rng, 5.0, 2, 8)
    reqs = [(0.0, "A", CHAT_S, 0, 0.0), (30.0, "B", CHAT_S, 0, 0.0), (70.0, "A", job_s, 0, 0.0),
            (asks, "B", CHAT_S, 0, 0.0, "chat", leaves), (second, "A", 30.0, 0, 0.0)]
    clients = [ClientSpec("A", 70.0, 140.0, 1.0, CHAT_S)]
    return _wl("h-client-leaves", f"A, then B load (A parks for B); from 70 s A serves a {job_s:g} "
               f"s job and a client's chats (1 s pauses) until 140 s; at {asks:g} s B's client "
               f"asks for B and leaves {leaves:g} s later, while A's park waits for a 30 s job "
               f"that came at {second:g} s (issue 24).", 160.0, [_engine("A"), _engine("B")],
               reqs, clients, {"b_asks_s": asks, "b_leaves_after_s": leaves}, _seed(rng))


def unfreeable(rng: random.Random | None = None) -> Workload:
    """ComfyUI with --highvram holds 12 GiB; a 14 GiB chat never fits, an 8 GiB one does."""
    engines = [_engine("comfy", 12.0, 11.0, park=None, drain=False,
                       note="in-process host: no park (--highvram), never stopped"),
               _engine("chat-14"), _engine("chat-8", 8.0, 6.5)]
    img, at = _draw(rng, 20.0, 10, 40), _draw(rng, 30.0, 20, 40)
    reqs = [(0.0, "comfy", img, 0, 0.0, "image"), (at, "chat-14", 2.0, 0, 0.0),
            (at + 1, "chat-8", 2.0, 0, 0.0), (at + 30, "chat-14", 2.0, 0, 0.0),
            (at + 31, "chat-8", 2.0, 0, 0.0), (at + 40, "comfy", img, 0, 0.0, "image")]
    return _wl("i-unfreeable", "A ComfyUI-like engine that nobody can stop and that has no park "
               "(--highvram) holds 12 GiB; a 14 GiB chat model can never have the card, an "
               "8 GiB one fits beside it (issue 24).", at + 70, engines, reqs, seed=_seed(rng))


# -- issue 34: clients that move between engines ----------------------------------------------

def _mover(rng: random.Random, engines, start_s: float, run_s: float, think: tuple[float, float],
           weights=(), service=(CHAT_S, 2.0)) -> ClientSpec:
    """A client that moves between ``engines`` (in turn, or by ``weights``)."""
    return ClientSpec(engines[0], start_s, start_s + run_s, think[0], service[0],
                      engines=tuple(engines), weights=tuple(weights), pause_max_s=think[1],
                      service_max_s=service[1], seed=rng.randrange(1 << 30))


def _think(rng: random.Random, lo: tuple[float, float], hi: tuple[float, float]):
    a = round(rng.uniform(*lo), 1)
    return a, round(max(a, rng.uniform(*hi)), 1)


def alternate_two(rng: random.Random) -> Workload:
    """One client, A, B, A, ... on two 14 GiB engines that do not fit together."""
    run_s, think = round(rng.uniform(120, 180)), _think(rng, (0, 1), (1, 5))
    c = _mover(rng, ("A", "B"), 0.0, run_s, think)
    return _wl("j-alternate-two", f"One client alternating two 14 GiB engines (both parked by "
               f"checkpoint) for {run_s:g} s, thinking {think[0]:g}-{think[1]:g} s after each "
               f"answer (issue 34).", run_s, [_engine("A"), _engine("B")], clients=[c],
               params={"run_s": run_s, "think_s": think}, seed=c.seed, issue=34)


def alternate_three(rng: random.Random) -> Workload:
    """One client, A, B, C, A, ... on three 14 GiB engines (one at a time on the card)."""
    run_s, think = round(rng.uniform(120, 180)), _think(rng, (0, 1), (1, 5))
    c = _mover(rng, ("A", "B", "C"), 0.0, run_s, think)
    return _wl("k-alternate-three", f"One client alternating three 14 GiB engines (parked by "
               f"checkpoint) for {run_s:g} s, thinking {think[0]:g}-{think[1]:g} s (issue 34).",
               run_s, [_engine("A"), _engine("B"), _engine("C")], clients=[c],
               params={"run_s": run_s, "think_s": think}, seed=c.seed, issue=34)


def think_times(rng: random.Random) -> Workload:
    """One client choosing A or B at random, thinking 0 to 30 s."""
    run_s, w = round(rng.uniform(150, 210)), round(rng.uniform(0.3, 0.7), 2)
    c = _mover(rng, ("A", "B"), 0.0, run_s, (0.0, 30.0), weights=(w, round(1 - w, 2)))
    return _wl("l-think-times", f"One client asking A (p={w:g}) or B at random, thinking 0-30 s "
               f"after each answer, for {run_s:g} s (issue 34).", run_s,
               [_engine("A"), _engine("B")], clients=[c],
               params={"run_s": run_s, "weights": [w, round(1 - w, 2)], "think_s": [0, 30]},
               seed=c.seed, issue=34)


def busy_beside(rng: random.Random) -> Workload:
    """A busy client on A beside a client alternating A and B."""
    run_s, pause = round(rng.uniform(120, 180)), round(rng.uniform(0.3, 2.0), 1)
    think = _think(rng, (1, 3), (3, 10))
    busy = ClientSpec("A", 0.0, run_s, pause, CHAT_S, service_max_s=2.0,
                      seed=rng.randrange(1 << 30))
    c = _mover(rng, ("A", "B"), round(rng.uniform(5, 20)), run_s, think)
    return _wl("m-busy-beside", f"A busy client on A (pauses {pause:g} s) beside a client "
               f"alternating A and B (thinking {think[0]:g}-{think[1]:g} s), for {run_s:g} s "
               f"(issue 34).", run_s, [_engine("A"), _engine("B")], clients=[busy, c],
               params={"run_s": run_s, "busy_pause_s": pause, "think_s": think},
               seed=c.seed, issue=34)


def comfy_chats(rng: random.Random) -> Workload:
    """A ComfyUI-like queue of image jobs beside a client alternating two chat models."""
    run_s = round(rng.uniform(150, 210))
    engines = [_engine("comfy", 18.0, 11.0, slots=1, retain_growth=True,
                       note="ComfyUI-like: loads 11 GiB, grows to 18 GiB rendering, keeps it"),
               _engine("chat-14", 14.0, 10.5), _engine("chat-8", 8.0, 6.5)]
    reqs, t = [], round(rng.uniform(0, 20), 1)
    while t < run_s - 30:
        at = t
        for _ in range(rng.randint(1, 4)):       # a batch: submitted one after another
            reqs.append((round(at, 1), "comfy", round(rng.uniform(5, 20), 1),
                         int(rng.uniform(5, 7) * GiB), 2.0, "image"))
            at += rng.uniform(0.5, 5)
        t += rng.uniform(40, 90)
    c = _mover(rng, ("chat-14", "chat-8"), round(rng.uniform(5, 15)), run_s,
               _think(rng, (1, 3), (3, 15)))
    return _wl("n-comfy-chats", f"A ComfyUI-like queue (one slot; 11 GiB loaded, grows to 18 "
               f"GiB and keeps it) of image jobs in batches, beside a client alternating a 14 "
               f"and an 8 GiB chat model, for {run_s:g} s (issue 34).", run_s, engines, reqs,
               [c], params={"run_s": run_s}, seed=c.seed, issue=34)


def bursty_ping_pong(rng: random.Random) -> Workload:
    """Two clients, one per engine, each sending bursts of requests back to back, then
    reading: a long turn for one side starves the other's bursts."""
    run_s = round(rng.uniform(120, 180))
    clients = []
    for e in ("A", "B"):
        clients.append(ClientSpec(e, round(rng.uniform(0, 10), 1), run_s,
                                  round(rng.uniform(3, 8), 1), CHAT_S,
                                  pause_max_s=round(rng.uniform(10, 25), 1), service_max_s=2.0,
                                  burst=rng.randint(3, 6), burst_gap_s=round(rng.uniform(0.2, 1),
                                                                             1),
                                  seed=rng.randrange(1 << 30)))
    a, b = clients
    return _wl("o-bursty-ping-pong", f"Two 14 GiB engines (checkpoint parks), one client each: "
               f"bursts of {a.burst} and {b.burst} requests {a.burst_gap_s:g} and "
               f"{b.burst_gap_s:g} s apart, then {a.pause_s:g}-{a.pause_max_s:g} and "
               f"{b.pause_s:g}-{b.pause_max_s:g} s of reading, for {run_s:g} s (issue 34).",
               run_s, [_engine("A"), _engine("B")], clients=clients,
               params={"run_s": run_s}, seed=a.seed, issue=34)


#: issue 24's shapes (rng=None: their live tests' parameters), then issue 34's (seeded only)
ISSUE_24 = {"e-ping-pong": ping_pong, "f-fresh-engine": fresh_engine, "g-priority": priority,
            "h-client-leaves": client_leaves, "i-unfreeable": unfreeable}
SHAPES = {**ISSUE_24, "j-alternate-two": alternate_two, "k-alternate-three": alternate_three,
          "l-think-times": think_times, "m-busy-beside": busy_beside,
          "n-comfy-chats": comfy_chats, "o-bursty-ping-pong": bursty_ping_pong}


def build_shapes(seed: int | None = None) -> dict[str, Workload]:
    """Every shape's workload, by name: each drawn from ``seed`` (shape ``i`` of
    :data:`SHAPES` gets ``random.Random(seed * 1000 + 100 + i)``); with ``seed=None`` the
    committed set: issue 24's shapes with their own parameters, issue 34's from seed 8."""
    out = {}
    for i, (name, make) in enumerate(SHAPES.items()):
        if seed is None and name in ISSUE_24:
            out[name] = make(None)
        else:
            out[name] = make(random.Random((8 if seed is None else seed) * 1000 + 100 + i))
    return out
