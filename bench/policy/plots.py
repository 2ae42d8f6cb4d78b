"""PNG plots of a set of runs (matplotlib, Agg backend).

Per workload: ``cdf-<workload>.png``, the distribution of waits per policy (symlog x axis, so
the many zero waits stay visible), and ``occupancy-<workload>.png``, one panel per policy with
each engine's residency stacked (GiB, summed over the cards) against the cards' total, and the
OOM events marked.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["write_plots"]

GiB = float(1 << 30)
_PEER_COLORS = {"swap": "#d62728", "swap-matrix": "#ff7f0e", "keepalive-evict": "#8c564b",
                "current-need": "#9467bd", "ideal": "#7f7f7f"}
_BERTH_COLORS = {"declared": "#1f77b4", "current": "#17becf", "growth": "#2ca02c"}


def _style(policy: str) -> dict:
    if policy == "berth-default":
        return {"color": "black", "linestyle": "-", "linewidth": 2.4}
    if policy.startswith("berth-"):
        _, queue, bound = policy.split("-")
        return {"color": _BERTH_COLORS[bound], "linestyle": "--" if queue == "strict" else "-",
                "linewidth": 1.6}
    return {"color": _PEER_COLORS.get(policy, "black"),
            "linestyle": ":" if policy == "ideal" else "-", "linewidth": 1.6}


def _cdf(recs: dict, workload: str, rev: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for pol, rec in recs.items():
        w = np.sort(np.asarray(rec.waits, dtype=float))
        if not len(w):
            continue
        y = np.arange(1, len(w) + 1) / len(w)
        ax.step(w, y, where="post", label=f"{pol} (p95 {rec.summary['p95_wait_s']:.0f} s)",
                **_style(pol))
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.01)
    ax.axhline(0.95, color="0.8", linewidth=0.8, zorder=0)
    ax.set_xlabel("wait before the first byte (s, symlog)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{workload}: waits per policy (commit {rev.split()[0]})")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _occupancy(recs: dict, workload: str, rev: str, path: Path) -> Path:
    pols = [p for p in recs if p != "ideal"]
    cols = 2
    rows = (len(pols) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.2 * rows), sharex=True, sharey=True,
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, pol in zip(axes.flat, pols, strict=False):
        rec = recs[pol]
        t = np.asarray(rec.times)
        step = max(1, len(t) // 1500)
        ys = [np.asarray(rec.engine_res[e][::step], dtype=float) / GiB for e in rec.engines]
        ax.stackplot(t[::step], *ys, labels=rec.engines,
                     colors=[cmap(i % 10) for i in range(len(ys))], linewidth=0)
        ax.axhline(sum(rec.card_total.values()) / GiB, color="black", linewidth=0.8)
        for (at, *_rest) in rec.ooms:
            ax.axvline(at, color="red", linewidth=0.6, alpha=0.6)
        s = rec.summary
        ax.set_title(f"{pol}: p95 {s['p95_wait_s']:.0f} s, OOM {s['oom_events']}", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(pols):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("GiB resident")
    for ax in axes[-1, :]:
        ax.set_xlabel("time (s)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"{workload}: card occupancy by engine (black: total; red: OOM) — "
                 f"commit {rev.split()[0]}", y=0.995, fontsize=10)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.975),
               ncol=min(8, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def write_plots(recorders: dict, out: Path, rev: str) -> list[Path]:
    """Write both plots for every workload in ``recorders`` (``{(workload, policy): Recorder}``)
    into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    by_wl: dict[str, dict] = {}
    for (wl, pol), rec in recorders.items():
        by_wl.setdefault(wl, {})[pol] = rec
    paths = []
    for wl, recs in by_wl.items():
        paths.append(_cdf(recs, wl, rev, out / f"cdf-{wl}.png"))
        paths.append(_occupancy(recs, wl, rev, out / f"occupancy-{wl}.png"))
    return paths
