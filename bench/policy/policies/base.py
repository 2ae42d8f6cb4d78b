"""The interface between the simulated machine and a policy.

The world calls :meth:`SimPolicy.on_arrival` for every request (and every retry); everything
else it posts after the fact, as completions a real broker would hear about: a load or wake
finished (``on_ready``), a checkpoint finished (``on_parked``), a process exited (``on_exit``,
``crashed`` when an OOM killed it), its memory shows free (``on_freed``), a process's residency
dropped (``on_mem``), a request started or ended (``on_job_start``, ``on_job_end``), and a
periodic driver read (``on_read``, every ``read_interval_s``). A posted event may find the
process in a later state than the one it reports; policies check ``proc.state``.
"""

from __future__ import annotations

import abc

__all__ = ["SimPolicy"]


class SimPolicy(abc.ABC):
    """Base class: hooks do nothing unless a policy needs them."""

    name = "policy"

    def attach(self, world) -> None:
        self.world = world

    def floor_bytes(self, pci: str) -> int:
        """Bytes the policy keeps free on ``pci`` (its reserve); 0 for the peers."""
        return 0

    def reserve_fraction(self) -> float:
        return 0.0

    def extra(self) -> dict:
        """Policy-specific figures added to the run's summary."""
        return {}

    @abc.abstractmethod
    def on_arrival(self, job) -> None:
        """A request (or a client's retry) arrives for ``job.engine``."""

    def on_job_start(self, job) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_job_end(self, job, ok: bool) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_ready(self, proc) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_parked(self, proc) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_exit(self, proc, crashed: bool) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_freed(self, proc) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_mem(self, proc, pci: str) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_lent(self, proc, pci: str) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_read(self, now: float) -> None:  # noqa: B027 (a hook a policy may leave alone)
        pass

    def on_leave(self, job) -> None:  # noqa: B027 (a hook a policy may leave alone)
        """``job``'s client gave up before it started: forget it (the world sends it nowhere)."""

    def on_loaded(self, proc) -> None:  # noqa: B027 (a hook a policy may leave alone)
        """A cold start finished loading: the engine answers its own health probe, though its
        manager (llama-swap) sees it ready only at its next poll (``on_ready``)."""
