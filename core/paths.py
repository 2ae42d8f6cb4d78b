"""Where Berth keeps its state, socket and simulated cards (DESIGN.md "Environment").

- state directory: ``$BERTH_STATE_DIR``, else ``/run/berth`` as root, else
  ``$XDG_RUNTIME_DIR/berth``, else ``/tmp/berth-$UID``;
- control socket: ``$BERTH_SOCKET``, else ``<state dir>/berthd.sock``;
- simulated cards: ``$BERTH_SIM_DIR``, else ``<state dir>/sim``;
- config: ``$BERTH_CONFIG``, else ``/etc/berth/berth.toml`` as root, else
  ``$XDG_CONFIG_HOME/berth/berth.toml`` (``~/.config/berth/berth.toml``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir", "socket_path", "sim_dir", "config_path"]


def state_dir() -> Path:
    env = os.environ.get("BERTH_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/berth")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "berth"
    return Path(f"/tmp/berth-{os.getuid()}")


def socket_path() -> Path:
    env = os.environ.get("BERTH_SOCKET")
    return Path(env) if env else state_dir() / "berthd.sock"


def sim_dir() -> Path:
    env = os.environ.get("BERTH_SIM_DIR")
    return Path(env) if env else state_dir() / "sim"


def config_path() -> Path:
    env = os.environ.get("BERTH_CONFIG")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/etc/berth/berth.toml")
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "berth" / "berth.toml"
