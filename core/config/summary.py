"""What a config means, in words (``berth config check``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from berth.decide.units import format_duration, format_size

if TYPE_CHECKING:             # the package imports this module at once: pydantic loads on use
    from .models import CardConfig, Config

# The engine entry the ComfyUI custom node leases ComfyUI's process under, and the allowance
# it takes when the entry names none (hosts/comfyui/agent.py, which a core module cannot import).
COMFYUI = "comfyui"
COMFYUI_ALLOWANCE_BYTES = 1 << 30

def _card_words(cc: CardConfig, declared_baseline: int | None) -> str:
    """A card's reserve, claims and baseline, in words."""
    s = f"reserve {format_size(cc.reserve)}"
    if cc.claims:
        s += f", claims {', '.join(f'{k}={format_size(v)}' for k, v in cc.claims.items())}"
    if cc.baseline is not None:
        s += f", baseline {format_size(cc.baseline)} (configured)"
    elif declared_baseline is not None:
        s += (f", baseline measured when berthd starts (the simulated card's own "
              f"{format_size(declared_baseline)})")
    else:
        s += ", baseline measured when berthd starts"
    if cc.name:
        s += f", shown as {cc.name}"
    return s


def summary(cfg: Config) -> str:
    """What a config means, in words: cards, reserves, engines, policy."""
    out = [f"driver: {cfg.driver.kind}"]
    for c in cfg.driver.cards:
        cc = cfg.card_config(c.pci, c.name)
        base = cc.baseline if cc.baseline is not None else c.baseline
        grant = c.total - cc.reserve - base - sum(cc.claims.values())
        out.append(f"  card {c.name} ({c.pci}): {format_size(c.total)} total, "
                   f"{_card_words(cc, c.baseline)}; at most {format_size(grant)} to grant")
    if cfg.driver.kind == "nvml":
        for key, cc in cfg.cards.items():
            out.append(f"  card {key}: {_card_words(cc, None)}")
        from .models import CardConfig
        out.append(f"  other cards: reserve {format_size(CardConfig().reserve)} (default), "
                   f"baseline measured when berthd starts")
    p = cfg.policy
    out.append(f"policy: queue {p.queue}, release_grace {format_duration(p.release_grace)}, "
               f"wake_limit {format_duration(p.wake_limit)}, wait_limit "
               f"{format_duration(p.wait_limit)}, min_turn {format_duration(p.min_turn)}, "
               f"juggle {p.juggle_max_swaps} swaps / {format_duration(p.juggle_window)}, "
               f"read_interval {format_duration(p.read_interval)}")
    out.append("ram budget for parks: " + (
        "auto (80% of the host RAM available when berthd starts)" if p.ram_budget == "auto"
        else format_size(p.ram_budget)))
    for name, e in cfg.engines.items():
        caps = ", ".join(x for x in (f"park={e.park}/{e.adapter}" if e.park else "",
                                     "lend" if e.lend else "",
                                     f"front={e.front}" if e.front else "") if x) or "no park"
        bound = str(e.bound)
        if name == COMFYUI and not (e.supervisor or e.url or e.front):
            # The entry the ComfyUI custom node leases under (hosts/comfyui/agent.py): it takes
            # the growth bound unless the entry names one, and parks by its own hook.
            if "bound" not in e.model_fields_set:
                allowance = (e.growth_allowance if "growth_allowance" in e.model_fields_set
                             else COMFYUI_ALLOWANCE_BYTES)
                bound = f"growth (the ComfyUI node's default), allowance {format_size(allowance)}"
            if not e.park:
                caps = "parks by the ComfyUI node's hook (not under --highvram or --gpu-only)"
        where = f"supervisor program {e.supervisor} ({e.mode})" if e.supervisor else (e.url or "")
        out.append(f"engine {name}: size {format_size(e.size)}"
                   + (f" on {e.card}" if e.card else "")
                   + f", bound {bound}, priority {e.priority} (keep_warm "
                     f"{format_duration(e.keep_warm)}); {caps}"
                   + (f"; {where}" if where else ""))
    return "\n".join(out)
