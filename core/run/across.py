"""Whether a run's checkpoint restores onto another card, and the ``--device-map`` of a wake
that berthd placed on other cards.

Source: issue 35 ("restore a checkpoint onto another card: since driver 580 / CUDA 13,
``cuda-checkpoint --action restore --device-map OLD_UUID=NEW_UUID``, every checkpointed card
listed ... treat it as best effort, detect support, and fall back").

- :func:`detect`: a run that parks by checkpoint asks its tool once (``--help`` names
  ``--device-map``); the lease request says so (``restore_across``), and berthd may then place
  the engine's wake on another card, as it places a grant.
- :func:`device_map`: the wake's cards against those the engine was checkpointed on, as the
  tool takes them (UUID to UUID, in the shares' order).
- :func:`refused`: a restore the tool refused (across chip kinds: CUDA error 801, the process
  left checkpointed) is reported as a failed wake, berthd falls back to a drain, and the run
  starts its engine again on the card it is given; from then on its leases say
  ``restore_across`` no more, so no later wake is placed where it would be refused again.
"""

from __future__ import annotations

import logging

from berth.decide.model import ParkMechanism

__all__ = ["detect", "device_map", "refused"]

log = logging.getLogger("berth.run")

#: The answer of each tool asked (its argv), for this process.
_known: dict[tuple[str, ...], bool] = {}
#: Why a restore onto another card was refused in this run (``None``: never).
_refused: list[str] = []


async def detect(park: str | None, checkpoint_path: str | None, options: dict) -> bool:
    """Whether this run's park restores onto another card: ``--park checkpoint``, a tool whose
    ``--help`` names ``--device-map``, and no refusal in this run yet."""
    if park != ParkMechanism.CHECKPOINT or _refused:
        return False
    from berth_plugins.checkpoint import argv_of, supports_device_map
    from berth_plugins.hookspecs import MechanismError
    opts = dict(options)
    if checkpoint_path:
        opts["checkpoint_path"] = checkpoint_path
    try:
        argv = tuple(argv_of(opts))
    except MechanismError:
        return False
    if argv not in _known:
        _known[argv] = await supports_device_map(list(argv))
        log.info("%s restores a checkpoint onto another card: %s", argv[-1],
                 "yes (--device-map)" if _known[argv] else "no (an older tool: it wakes "
                 "where it parked)")
    return _known[argv]


def device_map(old: list[dict], new: tuple[str, ...], cards: dict[str, dict]) -> dict[str, str]:
    """``{old UUID: new UUID}`` for a wake on ``new`` (PCI addresses) of an engine checkpointed
    on ``old`` (the grant's ``{"pci", "uuid", ...}``, in the same order); ``{}`` when the cards
    are the same, in the same order (two shares that swap cards are mapped). ``cards``: berthd's ``{pci: {"name", "uuid"}}``. Raises ``ValueError`` when
    the counts differ or a UUID is unknown."""
    before = [c["pci"] for c in old]
    if before == list(new):
        return {}
    if len(before) != len(new):
        raise ValueError(f"a wake on {len(new)} cards of an engine checkpointed on "
                         f"{len(before)}")
    out = {}
    for c, pci in zip(old, new, strict=True):
        u = (cards.get(pci) or {}).get("uuid")
        if not c.get("uuid") or not u:
            raise ValueError(f"no UUID for card {c['pci'] if not c.get('uuid') else pci}")
        out[c["uuid"]] = u
    return out


def refused(why: str) -> None:
    """A restore onto another card was refused: later leases of this run say it cannot."""
    _refused.append(why)
