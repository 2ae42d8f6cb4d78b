"""Berth: a GPU-memory broker for local inference engines.

The pure part (no I/O, no clock): :mod:`berth.model`, :mod:`berth.ledger`,
:mod:`berth.admission`, :mod:`berth.ladder`, :mod:`berth.scheduler`, :mod:`berth.measures`,
:mod:`berth.units`. Everything with I/O (driver, broker, API, front, CLI) sits at the edges.
"""

__version__ = "0.4.0.dev0"
