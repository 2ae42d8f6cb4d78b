"""supervisord's XML-RPC interface, through supervisor's own transport.

Source: reference/hosts.md "XML-RPC" (methods, faults, "Over the unix socket from Python") and
"Process state codes"; supervisor's ``docs/api.rst``, ``supervisor/xmlrpc.py``.

Berth never signals a supervisord program itself (rule 6): it asks supervisord, which owns the
process, with ``startProcess`` and ``stopProcess``. Every call opens a fresh connection (so
calls from several threads never share one) with a socket timeout, and raises
:class:`SupervisorError` (a fault, with supervisord's fault name) or
:class:`SupervisorUnavailable` (no answer). The blocking calls are meant to run off any event
loop (``asyncio.to_thread``).

The endpoint comes from berth.toml ``[hosts.supervisor]`` (``url``, ``username``,
``password``), else from ``$SUPERVISOR_SERVER_URL``, which supervisord sets for its children
(without credentials).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import xmlrpc.client

__all__ = ["STATES", "RUNNING_STATES", "STOPPED_STATES", "FAULTS", "Endpoint", "ProcessInfo",
           "Supervisor", "SupervisorError", "SupervisorUnavailable"]

#: Process state codes (supervisor/states.py), with their gaps.
STATES = {0: "STOPPED", 10: "STARTING", 20: "RUNNING", 30: "BACKOFF", 40: "STOPPING",
          100: "EXITED", 200: "FATAL", 1000: "UNKNOWN"}
#: A process exists (it has a PID) in these.
RUNNING_STATES = frozenset({"STARTING", "RUNNING", "STOPPING"})
#: No process exists in these: the program is down.
STOPPED_STATES = frozenset({"STOPPED", "EXITED", "FATAL"})

#: Fault codes (supervisor/xmlrpc.py ``Faults``).
FAULTS = {1: "UNKNOWN_METHOD", 2: "INCORRECT_PARAMETERS", 3: "BAD_ARGUMENTS",
          4: "SIGNATURE_UNSUPPORTED", 6: "SHUTDOWN_STATE", 10: "BAD_NAME", 11: "BAD_SIGNAL",
          20: "NO_FILE", 21: "NOT_EXECUTABLE", 30: "FAILED", 40: "ABNORMAL_TERMINATION",
          50: "SPAWN_ERROR", 60: "ALREADY_STARTED", 70: "NOT_RUNNING", 80: "SUCCESS",
          90: "ALREADY_ADDED", 91: "STILL_RUNNING", 92: "CANT_REREAD"}


class SupervisorError(RuntimeError):
    """supervisord answered with a fault. ``fault`` is its name (``NOT_RUNNING``, ``BAD_NAME``
    ...), ``code`` the number, ``detail`` supervisord's own text."""

    def __init__(self, call: str, code: int, detail: str):
        self.code, self.fault = code, FAULTS.get(code, f"FAULT_{code}")
        self.detail, self.call = detail, call
        super().__init__(f"supervisord refused {call}: {detail}")


class SupervisorUnavailable(ConnectionError):
    """supervisord's RPC socket could not be reached, did not answer in time, or supervisord is
    shutting down (fault ``SHUTDOWN_STATE``)."""


@dataclass(frozen=True)
class Endpoint:
    """Where supervisord's RPC listens: ``url`` is ``unix:///path.sock`` or
    ``http://host:port``; ``username``/``password`` as in ``[unix_http_server]``."""

    url: str
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_config(cls, cfg, env: Mapping[str, str] | None = None) -> "Endpoint":
        """From a :class:`berth.config.Config` (``[hosts.supervisor]``), else from
        ``$SUPERVISOR_SERVER_URL``. Raises ``ValueError`` when neither names one."""
        env = os.environ if env is None else env
        host = cfg.hosts.supervisor if cfg is not None else None
        if host is not None:
            return cls(host.url, host.username, host.password)
        if env.get("SUPERVISOR_SERVER_URL"):
            return cls(env["SUPERVISOR_SERVER_URL"])
        raise ValueError("hosts.supervisor: berth.toml has no [hosts.supervisor] url and "
                         "$SUPERVISOR_SERVER_URL is not set; say where supervisord's RPC "
                         "listens, e.g. url = \"unix:///run/supervisor.sock\"")


@dataclass(frozen=True)
class ProcessInfo:
    """``getProcessInfo`` for one program. ``start`` is supervisord's start time, whole seconds
    since the epoch (an int); ``pid`` is 0 when no process runs."""

    name: str
    group: str
    pid: int
    start: int
    state: int
    statename: str
    spawnerr: str = ""
    exitstatus: int = 0

    @classmethod
    def from_rpc(cls, d: dict) -> "ProcessInfo":
        return cls(name=d["name"], group=d["group"], pid=int(d["pid"]), start=int(d["start"]),
                   state=int(d["state"]), statename=d["statename"],
                   spawnerr=d.get("spawnerr", ""), exitstatus=int(d.get("exitstatus", 0)))

    @property
    def full_name(self) -> str:
        """``group:name``, which names the process unambiguously in every call."""
        return f"{self.group}:{self.name}"

    @property
    def running(self) -> bool:
        return self.statename in RUNNING_STATES and self.pid > 0


def _transport(ep: Endpoint, timeout_s: float) -> xmlrpc.client.Transport:
    try:
        from supervisor import xmlrpc as sx
    except ImportError:
        raise SupervisorUnavailable(
            "the supervisor package is not installed in Berth's Python; install it with "
            "pip install 'berth-gpu[supervisor]'") from None

    class _Unix(sx.UnixStreamHTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(self.socketfile)

    t = sx.SupervisorTransport(ep.username, ep.password, ep.url)
    if ep.url.startswith("unix://"):
        def connect_unix():
            conn = _Unix("localhost", timeout=timeout_s)
            conn.socketfile = ep.url[len("unix://"):]
            return conn
        t._get_connection = connect_unix
    else:
        make = t._get_connection

        def connect_http():
            conn = make()
            conn.timeout = timeout_s
            return conn
        t._get_connection = connect_http
    return t


class Supervisor:
    """Blocking calls to one supervisord. ``timeout_s`` bounds each call (seconds) unless the
    call gives its own (a stop that waits can take ``stopwaitsecs``)."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 5.0):
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        # Imported here, at the first call: berthd and every `berth run` load this host's
        # plugin, most never call a supervisord, and xmlrpc.client (http.client, expat) costs
        # each of their starts a few ms.
        import xmlrpc.client
        proxy = xmlrpc.client.ServerProxy(
            "http://127.0.0.1", transport=_transport(self.endpoint, timeout_s or self.timeout_s))
        call = f"supervisor.{method}({', '.join(map(repr, args))})"
        try:
            return getattr(proxy.supervisor, method)(*args)
        except xmlrpc.client.Fault as e:
            if e.faultCode == 6:          # SHUTDOWN_STATE: it is going away, nothing to do
                raise SupervisorUnavailable(f"{call}: supervisord is shutting down") from None
            raise SupervisorError(call, e.faultCode, e.faultString) from None
        except xmlrpc.client.ProtocolError as e:
            raise SupervisorUnavailable(f"{call} at {self.endpoint.url}: HTTP {e.errcode} "
                                        f"{e.errmsg} (wrong username or password?)") from None
        except (OSError, EOFError) as e:
            raise SupervisorUnavailable(f"{call} at {self.endpoint.url}: "
                                        f"{type(e).__name__}: {e}") from None
        finally:
            proxy("close")()

    def info(self, name: str) -> ProcessInfo:
        """``getProcessInfo(name)``; ``name`` is ``program`` or ``group:program``.
        Raises :class:`SupervisorError` (``BAD_NAME`` for an unknown program)."""
        return ProcessInfo.from_rpc(self._call("getProcessInfo", name))

    def config(self, name: str) -> dict:
        """The program's settings as supervisord read them (``getAllConfigInfo``, whose
        entries give ``startsecs``, ``startretries``, ``stopwaitsecs`` … but not
        ``autorestart``); ``name`` is ``program`` or ``group:program``. Raises
        :class:`SupervisorError` (``BAD_NAME``) for a program it does not know."""
        group, _, proc = name.rpartition(":")
        for d in self._call("getAllConfigInfo"):
            if d["name"] == proc and (not group or d["group"] == group):
                return d
        raise SupervisorError(f"supervisor.getAllConfigInfo() for {name!r}", 10,
                              f"BAD_NAME: {name}")

    def tail(self, name: str, n_bytes: int = 4096) -> str:
        """The last ``n_bytes`` of the program's stdout and stderr logs
        (``tailProcessStdoutLog``/``tailProcessStderrLog``), stdout first; a log that is not
        kept reads as empty."""
        out = []
        for method in ("tailProcessStdoutLog", "tailProcessStderrLog"):
            try:
                out.append(self._call(method, name, 0, n_bytes)[0])
            except SupervisorError:
                out.append("")
        return "\n".join(out)

    def all_info(self) -> list[ProcessInfo]:
        """``getAllProcessInfo()``."""
        return [ProcessInfo.from_rpc(d) for d in self._call("getAllProcessInfo")]

    def start(self, name: str, wait: bool = False, timeout_s: float | None = None) -> bool:
        """``startProcess(name, wait)``. With ``wait=False`` it returns once the process is
        spawned (it has a PID); with ``wait=True`` once it is RUNNING (after ``startsecs``).
        Raises :class:`SupervisorError` (``ALREADY_STARTED``, ``SPAWN_ERROR`` ...)."""
        return bool(self._call("startProcess", name, wait, timeout_s=timeout_s))

    def stop(self, name: str, wait: bool = True, timeout_s: float | None = None) -> bool:
        """``stopProcess(name, wait)``: supervisord sends the program's ``stopsignal`` and
        SIGKILL after ``stopwaitsecs``; with ``wait`` it returns when the main PID is reaped
        (its children may live on without ``stopasgroup``/``killasgroup``).
        Raises :class:`SupervisorError` (``NOT_RUNNING`` ...)."""
        return bool(self._call("stopProcess", name, wait, timeout_s=timeout_s))
