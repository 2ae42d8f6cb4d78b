"""The policy simulator: Berth's ladder against the peers' policies, on the same traces.

A discrete-event simulator in virtual time (:mod:`.loop`). :mod:`.world` is the simulated machine:
cards, engine processes, requests and what each mechanism costs. :mod:`.policies` decide what the
machine does: ``swap`` and ``swap-matrix`` (llama-swap), ``keepalive-evict`` (Ollama),
``current-need`` (a broker that admits on measured use), and Berth, whose decisions come from the
real pure core (``berth.decide.scheduler.Scheduler``) fed with virtual time. :mod:`.gen` writes the
seeded workloads under ``workloads/``; ``run.py`` replays them and prints the table.

Units everywhere: bytes (``int``, names end in ``_bytes``), seconds (``float``, ``_s``), and
decimal gigabytes per second (``_gbps``: 1e9 bytes per second), as the seeds quote them.
"""
