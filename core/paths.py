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
- a file in a directory other users can write (the fail-open lock in ``/dev/shm``, the simulated
  cards' lock) opens without following a symlink and without blocking, then is checked by
  ``fstat`` before use (:func:`open_shared`): a FIFO planted there made every ``berth run``
  block in ``open`` forever (issue 36);
- config, one rule for every process (:func:`find_config`): ``--config``, else
  ``$BERTH_CONFIG``, else ``/etc/berth/berth.toml`` as root, else
  ``$XDG_CONFIG_HOME/berth/berth.toml`` (``~/.config/berth/berth.toml``); a file named by the
  first two must exist;
- every file Berth writes is written whole or not at all (:func:`write_atomic`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = ["state_dir", "socket_path", "sim_dir", "config_path", "find_config", "CONFIG_PLACES",
           "client_socket", "default_sockets", "find_socket",
           "client_sim_dir", "prepare_state_dir", "open_lock", "open_shared", "check_socket",
           "write_atomic", "UnsafePath"]


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


def _owner(uid: int) -> str:
    """``uid 1001 (bob)``: a file's owner in words."""
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((w for test, w in _KINDS if test(mode)), "not a regular file")


def _refuse(path: Path, st: os.stat_result, why: str) -> UnsafePath:
    return UnsafePath(f"{path}: {why}, owned by {_owner(st.st_uid)}; refusing it (another user "
                      f"may have placed it: remove it)")


def open_shared(path: Path, flags: int = os.O_RDONLY, *, create_mode: int | None = 0o644,
                owners: tuple[int, ...] | None = None) -> int:
    """A descriptor on the regular file ``path`` in a directory other users may write; made with
    ``create_mode`` (exactly, whatever the umask) when missing and ``create_mode`` is not
    ``None``. Opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO there opens at once rather than
    blocking until a writer comes; a symlink is not followed), then checked by ``fstat``: a
    regular file with one link, not writable by group or others, owned by one of ``owners``
    (uids; ``None``: any user, for a file every user shares). Never ``O_CREAT`` on an existing
    file (``fs.protected_regular`` refuses that for another user's file in a sticky directory).
    Raises :class:`UnsafePath` naming the path, what it is and its owner; ``OSError`` otherwise
    (issue 36)."""
    path = Path(path)
    base = flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(20):
        try:
            fd = os.open(path, base)
        except FileNotFoundError:
            if create_mode is None:
                raise
            try:
                fd = os.open(path, base | os.O_CREAT | os.O_EXCL, create_mode)
                os.fchmod(fd, create_mode)          # every user opens it, whatever the umask
            except FileExistsError:
                continue                            # another process made it meanwhile
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                raise
            try:
                st = os.lstat(path)
            except OSError:
                raise e from None
            raise _refuse(path, st, _kind(st.st_mode)) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 0:
                # Replaced (an atomic write's rename) or removed between the open and the
                # fstat: the name now holds another file, so open the name again. Refused as
                # "a file with 0 links" it made a stub engine exit mid-run (issue 38's flake).
                os.close(fd)
                continue
            _check_shared(path, st, owners)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise OSError(errno.EAGAIN, "made and removed again and again", str(path))


def _check_shared(path: Path, st: os.stat_result, owners: tuple[int, ...] | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st, _kind(st.st_mode))
    if st.st_nlink != 1:
        raise _refuse(path, st, f"a file with {st.st_nlink} links (a hard link to another file)")
    if st.st_mode & 0o022:
        raise _refuse(path, st, f"a file of mode {stat.S_IMODE(st.st_mode):04o} (writable by "
                                f"other users; Berth makes it 0644 or 0600)")
    if owners is not None and st.st_uid not in owners:
        raise _refuse(path, st, "a file not made by this user, root or the directory's owner")


def open_lock(path: Path) -> int:
    """Open (creating, mode 0600) the lock file without following a symlink and without
    truncating it; returns the descriptor. Raises :class:`UnsafePath` for a symlink or a
    non-regular file in its place."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
            raise UnsafePath(f"{path}: is a symlink or not a file; refusing to open it (another "
                             f"user may have placed it)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, st, _kind(st.st_mode))
    os.set_blocking(fd, True)
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


def state_dir(cfg=None, env: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """The state directory (see the module docstring); ``cfg`` is a loaded berth.toml. ``env``
    and ``uid`` (effective): another process's, to tell where its berthd is (default: this
    process's)."""
    env = os.environ if env is None else env
    if env.get("BERTH_STATE_DIR"):
        return Path(env["BERTH_STATE_DIR"])
    if cfg is not None and getattr(cfg, "state_dir", None):
        return Path(cfg.state_dir)
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/run/berth")
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "berth"
    return _fallback(uid)


def socket_path(cfg=None, env: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """berthd's control socket (see the module docstring); ``cfg`` is a loaded berth.toml;
    ``env`` and ``uid`` as for :func:`state_dir`."""
    env = os.environ if env is None else env
    if env.get("BERTH_SOCKET"):
        return Path(env["BERTH_SOCKET"])
    if cfg is not None and getattr(getattr(cfg, "api", None), "socket", None):
        return Path(cfg.api.socket)
    return state_dir(cfg, env, uid) / "berthd.sock"


def _client_config():
    # berth.config finds its file here (find_config): the schema loads when a client asks.
    from berth.config import load_config
    return load_config()[0]


def _sim_places(found: Path):
    """``state_dir`` and ``[driver] sim_dir`` read straight from the TOML in ``found``, as the
    schema would give them (both plain strings there), or ``None`` when the file does not read
    or either is not a string: the caller then loads the whole config for its error."""
    import tomllib
    from types import SimpleNamespace
    try:
        data = tomllib.loads(found.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    driver = data.get("driver", {})
    if not isinstance(driver, dict):
        return None
    state, sim = data.get("state_dir"), driver.get("sim_dir")
    if not all(v is None or isinstance(v, str) for v in (state, sim)):
        return None
    return SimpleNamespace(state_dir=state, driver=SimpleNamespace(sim_dir=sim))


def client_sim_dir() -> Path:
    """The simulated cards' directory for a process other than berthd (the stub engine, the
    stand-in cuda-checkpoint, ``berth sim cards``): as berthd resolves it. These tools read
    only the two keys that name it (``state_dir``, ``[driver] sim_dir``): the schema's
    validation is berthd's and the clients', and it cost each of these short processes more
    CPU than all its own work (the stand-in cuda-checkpoint runs once per park and wake).
    Raises :class:`berth.config.ConfigError` when ``$BERTH_SIM_DIR`` is unset and the config
    file is missing, does not read, or gives either key a value that is not a string."""
    if os.environ.get("BERTH_SIM_DIR"):
        return Path(os.environ["BERTH_SIM_DIR"])
    found = find_config()
    if found is None:
        return sim_dir(None)        # the defaults name no place of their own
    places = _sim_places(found)
    return sim_dir(places if places is not None else _client_config())


def client_socket() -> Path:
    """The socket a client (``berth status``, ``berth run``) uses: as berthd resolves it, from
    the config berthd reads (:func:`berth.config.load_config`). With nothing naming it (no
    ``$BERTH_SOCKET``, ``$BERTH_STATE_DIR``, ``[api] socket`` or ``state_dir``), the first of
    :func:`default_sockets` where a socket is: a ``berth run`` that a manager started with
    another environment (no ``$XDG_RUNTIME_DIR`` under cron or a system unit, or a user's run
    beside a system berthd) finds berthd without shared variables (issue 37). Raises
    :class:`berth.config.ConfigError` when that config does not load: a client that went on
    with the default socket would report berthd unreachable where the config is at fault."""
    cfg = _client_config()
    named = os.environ.get("BERTH_SOCKET") or os.environ.get("BERTH_STATE_DIR") or (
        cfg is not None and (getattr(cfg, "state_dir", None) or getattr(cfg.api, "socket", None)))
    if named:
        return socket_path(cfg)
    return find_socket(default_sockets()) or socket_path(cfg)


def default_sockets() -> list[Path]:
    """Where berthd's socket is when nothing names it, this user's places first: the state
    directory's default now, ``/run/user/$UID/berth`` (``$XDG_RUNTIME_DIR`` as a login session
    sets it), ``/tmp/berth-$UID``, then a system berthd's ``/run/berth``."""
    out = [state_dir() / "berthd.sock"]
    for p in (Path(f"/run/user/{os.getuid()}/berth/berthd.sock"), _fallback() / "berthd.sock",
              Path("/run/berth/berthd.sock")):
        if p not in out:
            out.append(p)
    return out


def find_socket(places: list[Path]) -> Path | None:
    """The first of ``places`` that is a socket owned by this user or root, or ``None``."""
    for p in places:
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            if stat.S_ISSOCK(st.st_mode) and st.st_uid in (0, os.geteuid()):
                return p
    return None


def sim_dir(cfg=None) -> Path:
    env = os.environ.get("BERTH_SIM_DIR")
    if env:
        return Path(env)
    if cfg is not None and getattr(getattr(cfg, "driver", None), "sim_dir", None):
        return Path(cfg.driver.sim_dir)
    return state_dir(cfg) / "sim"


def config_path(env: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where berth.toml is when no ``--config`` names it: ``$BERTH_CONFIG``, else the default
    place (see the module docstring). It may not exist; :func:`find_config` says what to read.
    ``env`` and ``uid`` as for :func:`state_dir`."""
    mine = env is None
    env = os.environ if env is None else env
    if env.get("BERTH_CONFIG"):
        return Path(env["BERTH_CONFIG"])
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/etc/berth/berth.toml")
    home = str(Path.home()) if mine else env.get("HOME", "/")
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(home) / ".config")
    return Path(xdg) / "berth" / "berth.toml"


#: Where berth.toml is looked for, in words, for help pages (:func:`config_path` computes it;
#: ``berth --help`` keeps the same words in ``berth.cli.CONFIG_PLACES``).
CONFIG_PLACES = ("$BERTH_CONFIG, else /etc/berth/berth.toml as root, else "
                 "$XDG_CONFIG_HOME/berth/berth.toml (~/.config/berth/berth.toml)")


def find_config(path: str | os.PathLike | None = None) -> Path | None:
    """The berth.toml to read, by the one rule every process follows: ``path`` (a
    ``--config`` flag), else ``$BERTH_CONFIG``, else the default place; ``None`` when none is
    named and the default place has no file (the defaults apply). Raises
    :class:`berth.config.ConfigError`, one line, when ``--config`` or ``$BERTH_CONFIG`` names a
    file that does not exist: a typo must not run a machine on the defaults. Reads nothing, so
    ``berth run`` asks before its front listens."""
    from berth.config.errors import ConfigError
    if path:
        found, named = Path(path), "--config"
    elif os.environ.get("BERTH_CONFIG"):
        found, named = Path(os.environ["BERTH_CONFIG"]), "BERTH_CONFIG"
    else:
        found = config_path()
        return found if found.exists() else None
    if not found.exists():
        raise ConfigError(str(found), [("(file)", f"no such file (named by {named})")])
    return found


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` by ``data`` so that a reader, or the file after a crash, is the old
    file or the new one, never a part: a new file beside it (``mode``, less the umask; never
    following a symlink), written whole, fsync; rename over ``path``; fsync of the directory,
    so the rename itself survives a crash. Raises ``OSError``; then ``path`` is as it was and
    the new file is gone. Every file Berth writes goes through here (the state file, the
    simulated cards, the supervisord listener's mapping, ``berth llama-swap wrap -o``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
