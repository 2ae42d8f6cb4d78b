"""Where Berth keeps its state, socket and simulated cards (DESIGN.md "Environment").

- state directory: ``$BERTH_STATE_DIR``, else berth.toml's ``state_dir``, else ``/run/berth``
  as root, else ``$XDG_RUNTIME_DIR/berth``, else ``/tmp/berth-$UID``;
- control socket: ``$BERTH_SOCKET``, else berth.toml's ``[api] socket``, else
  ``<state dir>/berthd.sock``;
- simulated cards: ``$BERTH_SIM_DIR``, else ``<state dir>/sim``;
- the fallback ``/tmp/berth-$UID`` is anyone's to create, so berthd makes it with mode 0700 and
  refuses one that is a symlink, not owned by the user or open to others
  (:func:`prepare_state_dir`); the lock opens without following symlinks (:func:`open_lock`);
  a client refuses a socket there that is not its user's or root's (:func:`check_socket`)
  (issue 18, hole 3);
- config: ``$BERTH_CONFIG``, else ``/etc/berth/berth.toml`` as root, else
  ``$XDG_CONFIG_HOME/berth/berth.toml`` (``~/.config/berth/berth.toml``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["state_dir", "socket_path", "sim_dir", "config_path", "prepare_state_dir",
           "open_lock", "check_socket", "UnsafePath"]


class UnsafePath(PermissionError):
    """A state directory or socket another user could control; the message says which and why."""


def _fallback(uid: int | None = None) -> Path:
    return Path(f"/tmp/berth-{os.getuid() if uid is None else uid}")


def _check_private(path: Path) -> None:
    """Raise :class:`UnsafePath` unless ``path`` is a real directory (not a symlink) owned by
    this user with no access for group or others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path}: not a directory (a symlink or a file); another user may have "
                         f"made it. Remove it, or set BERTH_STATE_DIR")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{path}: owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
                         f"another user may have made it. Remove it, or set BERTH_STATE_DIR")
    if st.st_mode & 0o077:
        raise UnsafePath(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users in; "
                         f"expected 0700 (chmod 700 {path}, or set BERTH_STATE_DIR)")


def prepare_state_dir(sdir: Path) -> bool:
    """Make the state directory if missing; returns whether this call made it. The shared
    fallback ``/tmp/berth-$UID`` is made with mode 0700 and must stay private (raises
    :class:`UnsafePath` otherwise); other places are the operator's choice (``/run/berth``
    may be group-readable so the socket's group can reach it)."""
    sdir = Path(sdir)
    private = sdir == _fallback()
    made = False
    if private:
        try:
            os.mkdir(sdir, 0o700)
            made = True
        except FileExistsError:
            pass
        _check_private(sdir)
    else:
        made = not sdir.exists()
        sdir.mkdir(parents=True, exist_ok=True)
    return made


def open_lock(path: Path) -> int:
    """Open (creating, mode 0600) the lock file without following a symlink and without
    truncating it; returns the descriptor. Raises :class:`UnsafePath` for a symlink or a
    non-regular file in its place."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno in (40, 20):                     # ELOOP: a symlink; ENOTDIR
            raise UnsafePath(f"{path}: is a symlink; refusing to open it (another user may "
                             f"have placed it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path}: not a regular file")
    return fd


def check_socket(path: Path) -> None:
    """Before a client talks to ``path``: in the shared fallback directory, the directory must
    be private and the socket owned by this user or root (raises :class:`UnsafePath`); a
    socket named elsewhere (``$BERTH_SOCKET``, berth.toml) is the operator's choice."""
    path = Path(path)
    if path.parent != _fallback():
        return
    try:
        _check_private(path.parent)
        st = os.lstat(path)
    except FileNotFoundError:
        return                                      # nothing there: the connect says so
    if st.st_uid not in (0, os.geteuid()) or stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path}: owned by uid {st.st_uid}, not by you or root; not talking "
                         f"to it (another user may have placed it)")


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
    # berth.config resolves its default file here (config_path): imported when a client asks.
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
