"""Where Berth keeps its state, socket and simulated cards (DESIGN.md "Environment").

- state directory: ``$BERTH_STATE_DIR``, else berth.toml's ``state_dir``, else ``/run/berth``
  as root, else ``$XDG_RUNTIME_DIR/berth``, else ``/tmp/berth-$UID``;
- control socket: ``$BERTH_SOCKET``, else berth.toml's ``[api] socket``, else
  ``<state dir>/berthd.sock``;
- simulated cards: ``$BERTH_SIM_DIR``, else ``<state dir>/sim``;
- config: ``$BERTH_CONFIG``, else ``/etc/berth/berth.toml`` as root, else
  ``$XDG_CONFIG_HOME/berth/berth.toml`` (``~/.config/berth/berth.toml``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir", "socket_path", "sim_dir", "config_path"]


def state_dir(cfg=None) -> Path:
    """The state directory (see the module docstring); ``cfg`` is a loaded berth.toml."""
    env = os.environ.get("BERTH_STATE_DIR")
    if env:
        return Path(env)
    if cfg is not None and getattr(cfg, "state_dir", None):
        return Path(cfg.state_dir)
    if os.geteuid() == 0:
        return Path("/run/berth")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "berth"
    return Path(f"/tmp/berth-{os.getuid()}")


def socket_path(cfg=None) -> Path:
    """berthd's control socket (see the module docstring); ``cfg`` is a loaded berth.toml."""
    env = os.environ.get("BERTH_SOCKET")
    if env:
        return Path(env)
    if cfg is not None and getattr(getattr(cfg, "api", None), "socket", None):
        return Path(cfg.api.socket)
    return state_dir(cfg) / "berthd.sock"


def _client_config():
    path = config_path()
    if not path.exists():
        return None
    from berth.config import ConfigError, load
    try:
        return load(path)
    except ConfigError:
        return None


def client_sim_dir() -> Path:
    """The simulated cards' directory for a process other than berthd (the stub engine, the
    stand-in cuda-checkpoint, ``berth sim cards``): as berthd resolves it."""
    if os.environ.get("BERTH_SIM_DIR"):
        return Path(os.environ["BERTH_SIM_DIR"])
    return sim_dir(_client_config())


def client_socket() -> Path:
    """The socket a client (``berth status``, ``berth run``) uses: as berthd resolves it, with
    the config berthd would read (``$BERTH_CONFIG`` or the default place) when there is one."""
    if os.environ.get("BERTH_SOCKET"):
        return Path(os.environ["BERTH_SOCKET"])
    return socket_path(_client_config())


def sim_dir(cfg=None) -> Path:
    env = os.environ.get("BERTH_SIM_DIR")
    if env:
        return Path(env)
    if cfg is not None and getattr(getattr(cfg, "driver", None), "sim_dir", None):
        return Path(cfg.driver.sim_dir)
    return state_dir(cfg) / "sim"


def config_path() -> Path:
    env = os.environ.get("BERTH_CONFIG")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/etc/berth/berth.toml")
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "berth" / "berth.toml"
