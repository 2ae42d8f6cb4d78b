"""The plugin manager: built-in plugins, third-party plugins, and the calls the broker makes.

Source: DESIGN.md "The code" (manager.py: built-ins + entry point group "berth") and the note on
pluggy and coroutines; STYLE.md "pluggy and pytest" (built-ins are ordinary plugins named in a
plain tuple, third parties come through an entry-point group, validate at registration); issue
38 (adapters register through their own group, Berth's own too).

:func:`make_plugin_manager` registers, in order:

1. the built-in modules of :data:`BUILTINS` (the built-in front, the checkpoint), each under
   its module name;
2. the adapters of the entry-point group ``berth.adapters`` (:mod:`berth_plugins.adapters`), each
   under its adapter's name: Berth's own (berth-gpu's ``protocol = "berth_plugins.protocol"``
   ...) and, with ``load_entry_points``, third parties' alike;
3. with ``load_entry_points``, every plugin of the entry-point group ``berth``
   (``[project.entry-points.berth] name = "module"``), each under its entry-point name: third
   parties' and the hosts' own (berth-gpu's ``supervisor = "berth_hosts.supervisor.plugin"``;
   berth_plugins imports no host);

then checks them all at once, before anything runs. A plugin is refused with
:class:`PluginRefused`, naming the plugin and the hook, when:

- a function named ``berth_*`` matches no hook of :mod:`berth_plugins.hookspecs` (a misspelling;
  every ``berth_*`` function counts as a hook implementation, marked or not);
- an implementation takes an argument its hook does not offer (pluggy's validation);
- a decision hook (:data:`DECISION_HOOKS`) is ``async def``: pluggy never awaits, so its answer
  would be a coroutine, which is never ``None``;
- an action hook (:data:`ACTION_HOOKS`) is ``async def`` (it must return ``None`` when the action
  is not its own) or a wrapper (actions are called one implementation at a time);
- two plugins claim the same mechanism in ``berth_mechanisms`` (block one of them);
- an entry point cannot be imported;
- an adapter's ``berth_mechanisms`` does not name the adapter (``adapter = NAME`` would reach no
  plugin).

``block`` names plugins not to register: a built-in by its module name or its short name
(``"checkpoint"`` or ``"berth_plugins.checkpoint"``), an adapter by its name or its module, a
third-party plugin by its entry-point name. A name that matches nothing is a ``ValueError`` (a
typo would otherwise block nothing).

The calls: :func:`mechanisms` (what can be configured), :func:`adapters` (which of those are
adapters), :func:`run_action` (carry out one action under its time bound) and :func:`is_write`
(the front's hot path).
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import importlib.metadata
import inspect
import weakref
from typing import Any, Iterable

import pluggy

from . import adapters as registry
from . import builtin_front, hookspecs
from .hookspecs import PROJECT, ActionContext, CalledOff, MechanismError

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "ACTION_HOOKS", "DECISION_HOOKS", "PluginRefused",
           "make_plugin_manager", "mechanisms", "adapters", "run_action", "is_write"]

#: The built-in plugin modules that are no adapter, registered in this order (order never
#: decides the ladder). The adapters, Berth's own too, come through the group ``berth.adapters``
#: and a host's plugin (the supervisord host's) through ``berth``, like a third party's:
#: berth_plugins names no adapter here and imports no host.
BUILTINS = ("berth_plugins.builtin_front", "berth_plugins.checkpoint")

#: Third-party plugins register under this entry-point group.
ENTRY_POINT_GROUP = "berth"

#: Hooks that carry out a mechanism: plain ``def`` returning an awaitable or ``None``.
ACTION_HOOKS = ("berth_quiet", "berth_park", "berth_wake", "berth_lend", "berth_return",
                "berth_drain", "berth_start")
#: Hooks that answer at once: plain ``def``, never ``async``.
DECISION_HOOKS = ("berth_configure", "berth_mechanisms", "berth_vouch", "berth_front_is_write")
#: Actions that grow a holder back: refused unless the broker confirmed room (rule 2).
_GROWING = ("berth_wake", "berth_return")
_PREFIX = PROJECT + "_"


class PluginRefused(ValueError):
    """A plugin failed validation at startup. ``plugin`` is its registered name, ``hook`` the
    hook at fault (``None`` when the plugin could not be loaded at all)."""

    def __init__(self, plugin: str, hook: str | None, message: str):
        where = f"plugin {plugin!r}" + (f", hook {hook!r}" if hook else "")
        super().__init__(f"{where}: {message}")
        self.plugin, self.hook = plugin, hook


class _Manager(pluggy.PluginManager):
    """Every ``berth_*`` function is a hook implementation, marked with ``@hookimpl`` or not, so
    a misspelled hook cannot pass unnoticed as an ordinary function. ``adapter_names``: the
    adapters registered, by name."""

    adapter_names: list[str]

    def parse_hookimpl_opts(self, plugin: Any, name: str):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(_PREFIX):
            if inspect.isfunction(inspect.getattr_static(plugin, name, None)):
                return {}
        return opts


def _spec_names() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith(_PREFIX)]


def _check_plugin(pm: pluggy.PluginManager, name: str) -> None:
    """Refuse what pluggy lets through: unknown hooks, async or wrapping hooks where barred."""
    plugin = pm.get_plugin(name)
    for caller in pm.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            hook, fn = caller.name, impl.function
            if not caller.has_spec():
                near = difflib.get_close_matches(hook, _spec_names(), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise PluginRefused(name, hook, f"no such hook in berth_plugins.hookspecs{hint}")
            is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            if hook in DECISION_HOOKS and is_async:
                raise PluginRefused(name, hook, "a decision hook must be a plain `def`: pluggy "
                                                "does not await, and a coroutine is never None")
            if hook in ACTION_HOOKS and is_async:
                raise PluginRefused(name, hook, "an action hook must be a plain `def` that "
                                                "returns a coroutine for its own mechanism and "
                                                "None otherwise, not an `async def`")
            if hook in ACTION_HOOKS and (impl.wrapper or impl.hookwrapper):
                raise PluginRefused(name, hook, "an action hook cannot be a wrapper: actions are "
                                                "called one implementation at a time")


def _register(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as e:
        hook = next((h for h in _spec_names() if repr(h) in str(e)), None)
        raise PluginRefused(name, hook, " ".join(str(e).split())) from e
    _check_plugin(pm, name)


def _origin(ep: importlib.metadata.EntryPoint) -> str:
    """``entry point NAME = VALUE of DIST VERSION``: where a refused plugin came from. Asked only
    for a refusal: the distribution's metadata is a file to read and parse per entry point, at
    every berthd and ``berth run`` start otherwise (issue 38)."""
    dist = getattr(ep, "dist", None)
    return f"entry point {ep.name} = {ep.value}" + (
        f" of {dist.metadata['Name']} {dist.version}" if dist is not None else "")


def _load_entry_points(pm: pluggy.PluginManager, found: importlib.metadata.EntryPoints
                       ) -> set[str]:
    """Register every plugin of the ``berth`` group (of ``found``, every group's entry points);
    returns the entry-point names seen."""
    eps = list(found.select(group=ENTRY_POINT_GROUP))
    names: set[str] = set()
    for ep in eps:
        if ep.name in names:
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: another entry point has this name")
        names.add(ep.name)
        if pm.is_blocked(ep.name):
            continue
        if pm.has_plugin(ep.name):
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: a plugin with this name is already "
                                               "registered")
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
        except pluggy.PluginValidationError as e:
            hook = next((h for h in _spec_names() if repr(h) in str(e)), None)
            raise PluginRefused(ep.name, hook, " ".join(str(e).split())) from e
        except Exception as e:
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: cannot be loaded: "
                                               f"{type(e).__name__}: {e}") from e
        if pm.has_plugin(ep.name):
            _check_plugin(pm, ep.name)
    return names


def _load_adapters(pm: pluggy.PluginManager, own_only: bool,
                   found: importlib.metadata.EntryPoints | None) -> dict[str, str]:
    """Register the adapters of the group ``berth.adapters`` (``own_only``: Berth's own, else
    those of ``found``, every group's entry points), each under its adapter's name, unless
    blocked by that name or by its module. Returns every adapter entry point seen, name ->
    value (``"module"``), blocked ones too."""
    seen: dict[str, str] = {}
    for ep in registry.entry_points(own_only, found):
        if ep.name in seen:
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: another adapter has this name")
        seen[ep.name] = ep.value
        if pm.is_blocked(ep.name) or pm.is_blocked(ep.value):
            continue
        if pm.has_plugin(ep.name):
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: a plugin with this name is already "
                                               "registered")
        try:
            plugin = ep.load()
        except Exception as e:
            raise PluginRefused(ep.name, None, f"{_origin(ep)}: cannot be loaded: "
                                               f"{type(e).__name__}: {e}") from e
        _register(pm, plugin, ep.name)
    return seen


def _check_adapters(pm: pluggy.PluginManager, names: Iterable[str]) -> None:
    """Each registered adapter carries out the mechanism it is named for: ``adapter = NAME``
    in berth.toml reaches the plugin registered as ``NAME``."""
    claims = {impl.plugin_name: impl.function()
              for impl in pm.hook.berth_mechanisms.get_hookimpls()}
    for name in names:
        if name not in claims.get(name, ()):
            raise PluginRefused(name, "berth_mechanisms",
                                f"the adapter {name!r} must name itself among its mechanisms; "
                                f"it returns {claims.get(name, [])!r}")


def _check_mechanisms(pm: pluggy.PluginManager) -> None:
    """Each mechanism name is claimed by exactly one plugin, as a list of strings."""
    owners: dict[str, str] = {}
    for impl in pm.hook.berth_mechanisms.get_hookimpls():
        names = impl.function()
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n
                                                           for n in names):
            raise PluginRefused(impl.plugin_name, "berth_mechanisms",
                                f"must return a list of names, got {names!r}")
        for n in names:
            if n in owners and owners[n] != impl.plugin_name:
                raise PluginRefused(impl.plugin_name, "berth_mechanisms",
                                    f"mechanism {n!r} is already carried out by plugin "
                                    f"{owners[n]!r}; block one of them")
            owners[n] = impl.plugin_name


def make_plugin_manager(block: Iterable[str] = (), load_entry_points: bool = True
                        ) -> pluggy.PluginManager:
    """A checked plugin manager with the built-ins, Berth's own adapters and, with
    ``load_entry_points``, third parties' adapters and plugins and the hosts' plugins.

    ``block``: plugin names not to register (see the module docstring). Raises
    :class:`PluginRefused` for a plugin that fails validation, ``ValueError`` for a blocked name
    that matches no plugin.
    """
    pm = _Manager(PROJECT)
    pm.add_hookspecs(hookspecs)
    short = {m.rsplit(".", 1)[1]: m for m in BUILTINS}
    blocked = list(block)
    for name in blocked:
        if not isinstance(name, str) or not name:
            raise ValueError(f"block: expected plugin names, got {name!r}")
        pm.set_blocked(name)
        if name in short:
            pm.set_blocked(short[name])
    for modname in BUILTINS:
        if not pm.is_blocked(modname):
            _register(pm, importlib.import_module(modname), modname)
    # Every group's entry points read once, for the adapters' group and the plugins' (a read
    # parses every installed distribution's metadata).
    found = importlib.metadata.entry_points() if load_entry_points else None
    seen = _load_adapters(pm, not load_entry_points, found)
    pm.adapter_names = sorted(n for n in seen if pm.has_plugin(n))
    known = set(BUILTINS) | set(short) | set(seen) | set(seen.values())
    if load_entry_points:
        others = _load_entry_points(pm, found)
        known |= others
        unknown = [n for n in blocked if n not in known]
        if unknown:
            raise ValueError(f"block: no plugin named {', '.join(map(repr, unknown))} (built-ins: "
                             f"{', '.join(sorted(short))}; adapters: "
                             f"{', '.join(sorted(seen)) or 'none'}; entry points: "
                             f"{', '.join(sorted(others)) or 'none'})")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:   # _check_plugin refuses these first; a backstop
        name = pm.get_name(e.plugin) or repr(e.plugin)
        raise PluginRefused(name, None, str(e)) from e
    _check_mechanisms(pm)
    _check_adapters(pm, pm.adapter_names)
    return pm


def mechanisms(pm: pluggy.PluginManager) -> set[str]:
    """Every mechanism name some registered plugin carries out (``berth_mechanisms``)."""
    return {n for names in pm.hook.berth_mechanisms() for n in names}


def adapters(pm: pluggy.PluginManager) -> list[str]:
    """The names of the adapters registered in ``pm`` (group ``berth.adapters``), sorted: what
    ``adapter = NAME`` and ``berth run --adapter NAME`` may name."""
    return list(getattr(pm, "adapter_names", []))


#: Seconds the bound of an action waits past ``ctx.timeout_s``: a plugin that bounds its own
#: waits by ``ctx.timeout_s`` ends first, with its own error, which names what it waited for
#: (Ollama's "still lists qwen3:8b"); this bound catches one that does not. Without it the two
#: bounds raced, and on a loaded machine the plain "did not finish" won.
BACKSTOP_S = 1.0


async def run_action(pm: pluggy.PluginManager, hook_name: str, ctx: ActionContext) -> Any:
    """Carry out one action: call ``hook_name`` (one of :data:`ACTION_HOOKS`) for ``ctx``, take
    the one awaitable a plugin returned for ``ctx.mechanism``, await it under
    ``asyncio.timeout(ctx.timeout_s + BACKSTOP_S)`` (seconds) and return its result
    (``berth_quiet``: a bool).

    Raises :class:`MechanismError` when no plugin or more than one carries the action out, when
    a wake or return comes without ``ctx.room_confirmed`` (rule 2), when it does not finish in
    time, and when it fails (another exception is wrapped, naming the plugin). ``ValueError``
    for a hook name that is not an action.
    """
    if hook_name not in ACTION_HOOKS:
        raise ValueError(f"hook_name: expected one of {', '.join(ACTION_HOOKS)}, got {hook_name!r}")
    mech = ctx.mechanism
    if hook_name in _GROWING and not ctx.room_confirmed:
        raise MechanismError(mech, f"{hook_name} refused for engine {ctx.engine!r}: room not "
                                   "confirmed by a driver read (rule 2)")
    found: list[tuple[str, Any]] = []
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        try:
            result = impl.function(*([ctx] if impl.argnames else []))   # the one argument: ctx
        except MechanismError:
            raise
        except Exception as e:
            raise MechanismError(mech, f"plugin {impl.plugin_name!r} failed in {hook_name}: "
                                       f"{type(e).__name__}: {e}") from e
        if result is None:
            continue
        if not inspect.isawaitable(result):
            raise MechanismError(mech, f"plugin {impl.plugin_name!r} returned "
                                       f"{type(result).__name__} from {hook_name}; expected an "
                                       "awaitable or None")
        found.append((impl.plugin_name, result))
    if len(found) != 1:
        for _, aw in found:
            if inspect.iscoroutine(aw):
                aw.close()   # never awaited: close it so Python does not warn
        if not found:
            raise MechanismError(mech, f"no plugin carries out {hook_name} by {mech!r}")
        raise MechanismError(mech, f"more than one plugin carries out {hook_name} by {mech!r}: "
                                   f"{', '.join(n for n, _ in found)}")
    plugin, awaitable = found[0]
    try:
        async with asyncio.timeout(ctx.timeout_s + BACKSTOP_S) as bound:
            return await awaitable
    except (MechanismError, CalledOff):
        raise
    except TimeoutError as e:
        if bound.expired():
            raise MechanismError(mech, f"{hook_name} for engine {ctx.engine!r} did not finish "
                                       f"within {ctx.timeout_s:g} s (and {BACKSTOP_S:g} s "
                                       "more)") from None
        raise MechanismError(mech, f"plugin {plugin!r} failed in {hook_name}: timed out: "
                                   f"{e}") from e
    except Exception as e:
        raise MechanismError(mech, f"plugin {plugin!r} failed in {hook_name}: "
                                   f"{type(e).__name__}: {e}") from e


_front_callers: "weakref.WeakKeyDictionary[pluggy.PluginManager, Any]" = weakref.WeakKeyDictionary()


def is_write(pm: pluggy.PluginManager, engine: str, method: str, path: str) -> bool:
    """Does a ``method path`` request to ``engine`` need the engine awake? The first plugin
    answer of ``berth_front_is_write``; with none (the built-in blocked), GET, HEAD and OPTIONS
    are reads. The hook caller is looked up once per manager (this runs per request)."""
    caller = _front_callers.get(pm)
    if caller is None:
        caller = _front_callers[pm] = pm.hook.berth_front_is_write
    answer = caller(engine=engine, method=method, path=path)
    return builtin_front.is_write(method) if answer is None else bool(answer)
