"""Berth: a GPU-memory broker for local inference engines.

The pure part (no I/O, no clock): :mod:`berth.decide.model`, :mod:`berth.decide.ledger`,
:mod:`berth.decide.admission`, :mod:`berth.decide.ladder`, :mod:`berth.decide.scheduler`, :mod:`berth.decide.measures`,
:mod:`berth.decide.units`. Everything with I/O (driver, broker, API, front, CLI) sits at the edges.
"""

__version__ = "0.4.0.dev0"
