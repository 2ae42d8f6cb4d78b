"""``berth llama-swap wrap``: a llama-swap config whose models run under ``berth run``.

Source: issue 5; seed 002 "Fronts" and "Why the run owns the front for a routed engine";
reference/llama-swap.md ("How ``cmd`` is run", "Consequences for a ``cmd`` wrapper").

For every model, in order:

1. Parse its ``cmd`` as llama-swap does (:mod:`.command`). One that already runs ``berth run``
   is left as it is, so wrapping twice changes nothing. Refused, as llama-swap refuses them at
   load: a ``cmd`` that is not a string, and a macro that no ``macros`` block declares (in
   ``cmd``, ``cmdStop``, ``proxy``, ``checkEndpoint``, ``env``). Refused although llama-swap
   runs it: a quote left open in ``cmd`` (golib's split makes the rest of the command one word).
2. The engine's ``${PORT}`` becomes ``{port}``, the port ``berth run`` picks: in the ``cmd`` text,
   and in the macros that carry ``${PORT}`` into it. Such a macro is rewritten where it is
   declared when every use of it ends up in a ``cmd``; otherwise its text is put in place in
   that ``cmd`` (as llama-swap would) and the declaration stays as it was. Other macros stay
   as text and llama-swap still expands them.
3. Where requests reach the engine (:mod:`.proxy`): through the front on ``${PORT}``, with
   ``--upstream`` to an engine's own fixed address; refused where the proxy and ``cmd`` do
   not agree or the engine is on another host. Also refused: ``${PORT}`` in ``env`` (macros
   expanded as llama-swap does), which would now give the engine the front's port:
   ``{port}`` is put in place only in the command line.
4. The ``cmd`` becomes ``<berth> run --engine <engine> --front 127.0.0.1:${PORT} --front-health
   --keep-front [--upstream URL] [--health PATH] [--park checkpoint --checkpoint-path PATH]
   [--size SIZE[@CARD]]… -- <the engine's command>``, ``<berth>`` the absolute path of the
   running ``berth`` and ``--park checkpoint`` there when cuda-checkpoint is found
   (:mod:`.defaults`);
   ``--health`` mirrors ``checkEndpoint`` under the proxy's path (``none`` too). A block ``cmd`` stays a block, its
   comment lines and backslash continuations kept. The result is split again and must give
   exactly ``berth run …`` followed by the engine's old argv. ``<engine>`` is the model ID, or,
   for an ID with whitespace or control characters (berthd refuses those in an engine name),
   the ID with each run of them replaced by ``-`` (made unique), with a warning: its berth.toml
   entry is ``[engines."<engine>"]``.
5. ``cmdStop`` is kept: a ``docker stop`` still stops the container, the ``docker run`` client
   exits, and ``berth run`` sees its engine exit, releases the lease and exits. ``${PID}`` in it
   now names ``berth run``.

Then for the whole config: groups (:mod:`.groups`), ``healthCheckTimeout`` raised to cover
the wait for a lease and ``unloadTimeout`` to cover ``berth run``'s stop sequence
(:mod:`.timeouts`), and the read paths in ``upstream.ignorePaths`` (:mod:`.defaults`).
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from . import command, defaults, yamlio
from .command import PORT
from .groups import GroupError, regroup
from .proxy import FRONT_HOST, ProxyError, address, front
from .timeouts import (
    CONTAINER_TOOLS,
    MIN_HEALTH_CHECK_TIMEOUT_S,
    MIN_UNLOAD_TIMEOUT_S,
    SettingError,
    fit_timeouts,
)

__all__ = ["WrapError", "WrapOptions", "Report", "wrap_text", "wrap_config", "is_wrapped",
           "sizes_from", "MIN_HEALTH_CHECK_TIMEOUT_S", "MIN_UNLOAD_TIMEOUT_S", "FRONT_HOST"]

_MACRO_REF = re.compile(r"\$\{([a-zA-Z0-9_-]+)\}")
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./${}~-]+$")
#: What berthd refuses in an engine name: whitespace and control characters.
_NOT_IN_NAME = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
#: The model keys whose macros wrap checks are declared; llama-swap refuses any left unexpanded
#: (``${PID}`` only in ``cmdStop``).
_MACRO_KEYS = ("cmd", "cmdStop", "proxy", "checkEndpoint", "env")


class WrapError(ValueError):
    """A config that cannot be wrapped; the message names the model and the key."""


@dataclass
class WrapOptions:
    """``park``: ``auto`` (checkpoint when cuda-checkpoint is found, else drain),
    ``checkpoint`` or ``none``. ``sizes``: model ID -> ``--size`` values (from
    :func:`sizes_from`), or ``None`` to leave sizes to berth.toml. ``berth``: the ``berth``
    executable llama-swap runs (it runs no shell, so this must be on its PATH or absolute;
    ``None``: the absolute path of the running one). ``front_health``: ``--front-health`` and
    ``--keep-front`` on every run line; ``ignore_reads``: the read paths in
    ``upstream.ignorePaths`` (:mod:`.defaults`)."""

    park: str = "auto"
    sizes: dict[str, list[str]] | None = None
    berth: str | None = None
    checkpoint_path: str | None = None
    min_health_check_timeout_s: int = MIN_HEALTH_CHECK_TIMEOUT_S
    front_health: bool = True
    ignore_reads: bool = True


@dataclass
class Report:
    """What a wrap did: models wrapped now, models already wrapped, notes, warnings, and the
    engine names that differ from their model IDs (model ID -> engine name)."""

    wrapped: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    engines: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def is_wrapped(argv: list[str]) -> bool:
    """Whether an argv already runs ``berth run``."""
    return len(argv) >= 2 and os.path.basename(argv[0]) == "berth" and argv[1] == "run"


def _run_option(argv: list[str], name: str) -> str | None:
    """The value of ``berth run``'s option ``name`` in an already wrapped argv."""
    for i, word in enumerate(argv[2:], start=2):
        if word == "--":
            break
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _refs(value) -> set[str]:
    """Every macro name ``${name}`` used in a value (strings inside mappings and lists too)."""
    if isinstance(value, str):
        return set(_MACRO_REF.findall(value))
    if isinstance(value, dict):
        return set().union(*(_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value)) if value else set()
    return set()


def _macros(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WrapError(f"{where}: expected a mapping of macro names to values, got "
                        f"{type(value).__name__}")
    return value


def _quote(word: str) -> str:
    """A word for a ``cmd``: bare when llama-swap's split keeps it whole (``${PORT}`` stays
    bare so the text replacement still sees it), else single-quoted."""
    return word if _SAFE_WORD.match(word) else shlex.quote(word)


def _kind(value) -> str:
    """A YAML value's kind, in words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _strings(value):
    """Every string in a value (inside mappings and lists too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _check_macros(mid: str, conf: dict, scope: command.Macros) -> None:
    """Refuse a ``${name}`` that no macro declares, as llama-swap does at load ("unknown
    macro"), in the keys wrap reads."""
    for key in _MACRO_KEYS:
        for text in _strings(conf.get(key)):
            if key in ("cmd", "cmdStop"):
                text = command.strip_comments(text)
            known = {"PORT", "PID"} if key == "cmdStop" else {"PORT"}
            for name in _MACRO_REF.findall(command.expand(text, scope)):
                if name not in known:
                    raise WrapError(
                        f"models.{mid}.{key}: unknown macro ${{{name}}}: neither macros nor "
                        f"models.{mid}.macros declares it, and llama-swap refuses to load a "
                        f"config that uses one; declare it, or fix its name")


def _check_quotes(mid: str, cmd: str, scope: command.Macros) -> None:
    """Refuse a quote left open in ``cmd`` (macros expanded): golib's split does not complain,
    it makes the rest of the command one word, which is never what was meant."""
    text = command.sanitize(command.expand(command.strip_comments(cmd), scope))
    at = command.open_quote(text)
    if at is not None:
        rest = " ".join(text[at:].split())
        shown = rest if len(rest) <= 40 else rest[:39] + "…"
        raise WrapError(f"models.{mid}.cmd: the quote {text[at]} that opens {shown!r} is never "
                        f"closed (macros expanded); llama-swap would pass everything after it to "
                        f"the engine as one word; close it")


@dataclass
class _Model:
    id: str
    conf: dict
    scope: command.Macros
    argv: list[str]
    wrapped: bool
    has_port: bool                 # the engine's cmd uses ${PORT} (macros expanded)
    fixed: str | None = None       # host:port the engine listens on, when fixed
    engine: str = ""               # the engine name on its berth run line


def _models(doc) -> dict[str, _Model]:
    if not isinstance(doc, dict):
        raise WrapError(f"the top level: expected a mapping with a 'models' key, got "
                        f"{type(doc).__name__}")
    models = doc.get("models")
    if models is None or models == {}:
        raise WrapError("models: the config has no models; llama-swap needs at least one "
                        "under 'models:', each with a cmd")
    if not isinstance(models, dict):
        raise WrapError(f"models: expected a mapping of model IDs, got {type(models).__name__}")
    globals_ = list(_macros(doc.get("macros"), "macros").items())
    out = {}
    for key in list(models):
        mid = str(key)
        conf = models[key]
        if not isinstance(conf, dict):
            raise WrapError(f"models.{mid}: expected a mapping with cmd, got "
                            f"{type(conf).__name__}")
        conf = models[key] = copy.deepcopy(conf)    # YAML aliases may share one mapping
        cmd = conf.get("cmd")
        if cmd is None or (isinstance(cmd, str) and not cmd.strip()):
            raise WrapError(f"models.{mid}.cmd: missing or empty; every model needs the "
                            f"command that starts its engine")
        if not isinstance(cmd, str):
            raise WrapError(f"models.{mid}.cmd: must be a string (the command that starts the "
                            f"engine), got {_kind(cmd)}: {cmd!r}")
        for k in ("env", "aliases"):       # llama-swap reads both as []string
            v = conf.get(k)
            if v is not None and (not isinstance(v, list)
                                  or any(isinstance(x, (list, dict)) for x in v)):
                like = '["NAME=value"]' if k == "env" else '["gpt-4o"]'
                raise WrapError(f"models.{mid}.{k}: expected a list of strings like {like}, "
                                f"got {_kind(v)}: {v!r}")
        local = list(_macros(conf.get("macros"), f"models.{mid}.macros").items())
        scope = command.scope(mid, globals_, local)
        _check_macros(mid, conf, scope)
        _check_quotes(mid, cmd, scope)
        argv = command.argv(cmd, scope)
        if not argv:
            raise WrapError(f"models.{mid}.cmd: no command is left once the comment lines are "
                            f"dropped")
        has_port = PORT in command.expand(command.strip_comments(cmd), scope)
        out[mid] = _Model(mid, conf, scope, argv, is_wrapped(argv), has_port)
    return out


def _port_macros(doc: dict, models: dict[str, _Model]) -> tuple[set[str], set[str]]:
    """Macros that carry ``${PORT}`` into a ``cmd``: ``(rewrite, inline)`` by name. A macro is
    rewritten where declared when it is used only in ``cmd`` values of models wrapped now
    (directly or through other such macros); otherwise it is put in place in those ``cmd``s."""
    decls = list(_macros(doc.get("macros"), "macros").items())
    for m in models.values():
        decls += list(_macros(m.conf.get("macros"), f"models.{m.id}.macros").items())
    carriers: set[str] = set()
    outside: set[str] = set()
    for key, value in doc.items():
        if key not in ("macros", "models"):
            outside |= _refs(value)
    for m in models.values():
        for key, value in m.conf.items():
            if key == "macros" or (key == "cmd" and not m.wrapped):
                continue
            outside |= _refs(value)
    changed = True
    while changed:
        changed = False
        for name, value in decls:
            if not isinstance(value, str):
                continue
            if name not in carriers and (PORT in value or _refs(value) & carriers):
                carriers.add(name)
                changed = True
            if name in outside and not _refs(value) <= outside:
                outside |= _refs(value)
                changed = True
    return carriers - outside, carriers & outside


def _rewrite_macros(doc: dict, models: dict[str, _Model], names: set[str]) -> None:
    """``${PORT}`` -> ``{port}`` in the declarations of ``names``; scopes follow."""
    blocks = [doc.get("macros")] + [m.conf.get("macros") for m in models.values()]
    for block in blocks:
        for name in names & set(block or {}):
            if isinstance(block[name], str):
                block[name] = yamlio.like(block[name], block[name].replace(PORT, "{port}"))
    globals_ = list((doc.get("macros") or {}).items())
    for m in models.values():
        m.scope = command.scope(m.id, globals_, list((m.conf.get("macros") or {}).items()))


def _engine_text(m: _Model, inline: set[str]) -> tuple[str, dict[str, str | None]]:
    """The model's ``cmd`` text with port-carrying macros put in place and ``${PORT}`` ->
    ``{port}``; anything else as written. Also where its ``${env.…}`` come from: ``cmd`` or a
    macro's name -> the YAML style that text was written in."""
    text = m.conf["cmd"]
    values = dict(m.scope)
    env = {"cmd": yamlio.style_of(text)} if yamlio.ENV_REF in text else {}
    for _ in range(64):
        present = [n for n in _MACRO_REF.findall(text) if n in inline and n in values]
        if not present:
            break
        for n in present:
            text = text.replace("${%s}" % n, command.macro_text(values[n]))
            if yamlio.ENV_REF in command.macro_text(values[n]):
                env[f"macro {n}"] = yamlio.style_of(values[n])
    else:
        raise WrapError(f"models.{m.id}.cmd: macros {sorted(inline)} keep expanding into each "
                        f"other")
    return text.replace(PORT, "{port}"), env


_STYLE_WORDS = {None: "plain", "'": "single-quoted", '"': "double-quoted", "|": "a block",
                ">": "a block"}


def _env_style(m: _Model, env: dict[str, str | None]) -> str | None:
    """The one style the wrapped ``cmd`` must be written in so that every ``${env.…}`` it
    holds is pasted into the context it was written for (``internal/config/macros.go``).
    Raises :class:`WrapError` when its parts were written in different ones."""
    words = {where: _STYLE_WORDS[style] for where, style in env.items()}
    if len(set(words.values())) > 1:
        shown = ", ".join(f"{where} is {word}" for where, word in words.items())
        raise WrapError(f"models.{m.id}.cmd: wrapping puts ${{env.…}} from differently quoted "
                        f"text into one cmd ({shown}); llama-swap pastes an environment value "
                        f"into the YAML text before parsing it, so the quotes decide the value; "
                        f"quote them alike")
    return next(iter(env.values())) if env else None


def _container(argv: list[str]) -> bool:
    return (os.path.basename(argv[0]) in CONTAINER_TOOLS
            and (argv[1:2] == ["run"] or argv[1:3] == ["container", "run"]))


def _wrap_model(m: _Model, inline: set[str], opts: WrapOptions, report: Report) -> None:
    """Steps 2–5 for one model; ``m.conf`` is changed in place."""
    # The rewritten macros give {port} where the old ones gave ${PORT}: the same argv.
    engine_argv = command.argv(m.conf["cmd"], m.scope, port="{port}")
    try:
        step3 = front(m.id, m.conf, m.scope, m.has_port)
    except ProxyError as e:
        raise WrapError(str(e)) from None
    upstream, proxy, path, m.fixed = step3.upstream, step3.proxy, step3.path, step3.fixed
    if step3.note:
        report.notes.append(step3.note)
    body, env = _engine_text(m, inline)
    env_style = _env_style(m, env)
    container = _container(engine_argv)
    words = [opts.berth, "run", "--engine", m.engine, "--front", f"{FRONT_HOST}:{PORT}"]
    if opts.front_health:
        words += ["--front-health", "--keep-front"]
    if upstream:
        words += ["--upstream", upstream]
    # berth run polls the engine itself, at the path llama-swap's check reaches it by.
    check = str(m.conf.get("checkEndpoint") or "/health")
    health = check if check == "none" else path.rstrip("/") + check
    if health != "/health":
        words += ["--health", health]
    if opts.park == "checkpoint":
        if container:
            report.warnings.append(
                f"models.{m.id}: wrapped without --park checkpoint: its cmd starts a container, "
                f"whose processes are not children of berth run, so cuda-checkpoint cannot reach "
                f"them; Berth drains this model instead of parking it")
        else:
            words += ["--park", "checkpoint"]
            if opts.checkpoint_path:
                words += ["--checkpoint-path", opts.checkpoint_path]
    if opts.sizes is not None:
        if m.engine in opts.sizes:
            for size in opts.sizes[m.engine]:
                words += ["--size", size]
        else:
            report.warnings.append(
                f"models.{m.id}: berth.toml has no [engines.\"{m.engine}\"] entry, so berthd "
                f"will refuse its lease (no size); add one with size = \"…GiB\"")
    words.append("--")
    prefix = " ".join(_quote(w) for w in words)
    tidy = "\n".join(line.rstrip() for line in body.split("\n")).strip("\n")
    if command.argv(tidy, m.scope) == command.argv(body, m.scope):
        body = tidy
    new = f"{prefix}\n{body}\n" if "\n" in body.strip("\n") else f"{prefix} {body.strip()}"
    got = command.argv(new, m.scope)
    expected = [command.expand(w, m.scope) for w in words]
    if got[:len(words)] != expected or got[len(words):] != engine_argv:
        raise WrapError(f"models.{m.id}.cmd: the wrapped command would not split back into "
                        f"berth run followed by the engine's own argv {engine_argv}; "
                        f"simplify its quoting")
    if PORT in command.expand(command.strip_comments(body), m.scope):
        raise WrapError(f"models.{m.id}.cmd: ${{PORT}} still reaches the engine through a macro")
    m.conf["cmd"] = yamlio.EnvText(new, env_style) if env else new
    if proxy is not None:
        m.conf["proxy"] = proxy
    _warn_cards(m, engine_argv, container, report)


def _warn_cards(m: _Model, argv: list[str], container: bool, report: Report) -> None:
    env = m.conf.get("env") or []
    if any(str(e).startswith("CUDA_VISIBLE_DEVICES=") for e in env):
        report.warnings.append(
            f"models.{m.id}.env: sets CUDA_VISIBLE_DEVICES, which berth run replaces with the "
            f"cards Berth grants; to pin the model to a card, set card = \"…\" in its "
            f"[engines.\"{m.engine}\"] entry of berth.toml (or --size SIZE@CARD)")
    if container and not any("CUDA_VISIBLE_DEVICES" in a for a in argv):
        report.warnings.append(
            f"models.{m.id}.cmd: the container does not see the cards Berth grants: berth run "
            f"sets CUDA_VISIBLE_DEVICES for the {os.path.basename(argv[0])} client only; add "
            f"'-e CUDA_VISIBLE_DEVICES' to pass it into the container")
    _note_fit(m, argv, env, report)
    stop = m.conf.get("cmdStop")
    if stop and "${PID}" in str(stop):
        report.notes.append(f"models.{m.id}.cmdStop: ${{PID}} is now berth run's pid; a signal "
                            f"sent there runs berth run's stop sequence")


def _note_fit(m: _Model, argv: list[str], env: list, report: Report) -> None:
    """Say what berth run does to a llama-server that sizes itself to what is free (issue 37):
    bounds it to its lease with ``--fit-target``, unless the command pins its own fit."""
    from berth.run import fit
    if fit.find_server(argv) is None:
        return
    why = fit.pinned(argv, dict(str(e).split("=", 1) for e in env if "=" in str(e)))
    report.notes.append(
        f"models.{m.id}.cmd: llama-server left as written: {why}" if why else
        f"models.{m.id}.cmd: llama-server sets no fit of its own: berth run adds --fit-target "
        f"from its lease at start (its log says the value), so --fit fills the lease, not the "
        f"card; set --fit, --fit-target, or -ngl and -c to choose yourself")


def _engine_names(models: dict[str, _Model], report: Report) -> None:
    """``m.engine`` for every model: the model ID when berthd accepts it as an engine name (no
    whitespace, no control characters), else the ID with each run of those replaced by ``-``,
    made unique among the other engine names, with a warning."""
    taken = set()
    for m in models.values():
        if m.wrapped:
            m.engine = _run_option(m.argv, "--engine") or m.id
        elif not _NOT_IN_NAME.search(m.id):
            m.engine = m.id
        else:
            continue
        taken.add(m.engine)
    for m in models.values():
        if m.engine:
            continue
        base = _NOT_IN_NAME.sub("-", m.id.strip()) or "model"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        m.engine = name
        report.engines[m.id] = name
        report.warnings.append(
            f"models.{m.id}: the model ID {m.id!r} has whitespace or control characters, which "
            f"berthd refuses in an engine name; its berth run line uses --engine {name}, so its "
            f"berth.toml entry must be [engines.\"{name}\"]")


def _check_env(m: _Model, report: Report) -> None:
    """``${PORT}`` in ``env`` (macros expanded, as llama-swap expands them) is the front's port
    once wrapped: refuse it for a model wrapped now, warn for one already wrapped."""
    for item in _strings(m.conf.get("env")):
        expanded = command.expand(item, m.scope)
        if PORT not in expanded:
            continue
        via = "" if expanded == item else f" ({expanded!r} once macros are expanded)"
        what = (f"models.{m.id}.env: {item!r}{via} gives the engine llama-swap's ${{PORT}}, "
                f"which under berth run is the front's port, not the engine's: berth run picks "
                f"the engine's port at each start and puts it only in the command line, in "
                f"place of {{port}}")
        if m.wrapped:
            report.warnings.append(what)
            return
        raise WrapError(f"{what}; pass the port on the command line instead (e.g. --port "
                        f"${{PORT}}, which wrap turns into --port {{port}}) and drop it from env")


def _resolve(opts: WrapOptions, report: Report) -> WrapOptions:
    """The options with the defaults of :mod:`.defaults` filled in."""
    try:
        park, berth, tool = defaults.resolve(opts.park, opts.berth, opts.checkpoint_path,
                                             report.notes, report.warnings)
    except ValueError as e:
        raise WrapError(str(e)) from None
    return replace(opts, park=park, berth=berth, checkpoint_path=tool)


def wrap_config(doc, opts: WrapOptions | None = None) -> Report:
    """Wrap a parsed llama-swap config in place. Raises :class:`WrapError`."""
    report = Report()
    opts = _resolve(opts or WrapOptions(), report)
    models = _models(doc)
    _engine_names(models, report)
    for m in models.values():
        _check_env(m, report)
    rewrite, inline = _port_macros(doc, models)
    _rewrite_macros(doc, models, rewrite)
    for m in models.values():
        if m.wrapped:
            report.already.append(m.id)
            upstream = _run_option(m.argv, "--upstream")
            if upstream:
                m.fixed = address(urlsplit(command.expand(upstream, m.scope)))
            continue
        _wrap_model(m, inline, opts, report)
        report.wrapped.append(m.id)
    if rewrite:
        report.notes.append(f"macros {', '.join(sorted(rewrite))}: ${{PORT}} -> {{port}} (the "
                            f"engine's port, picked by berth run)")
    clashes: dict[str, list[str]] = {}
    for m in models.values():
        if m.fixed:
            clashes.setdefault(m.fixed, []).append(m.id)
    clashes = {addr: ids for addr, ids in clashes.items() if len(ids) > 1}
    try:
        grouping = regroup(doc, list(models), clashes)
    except GroupError as e:
        raise WrapError(str(e)) from None
    report.notes += grouping.notes
    report.warnings += grouping.warnings
    try:
        report.warnings += fit_timeouts(doc, [(m.id, m.conf, m.scope) for m in models.values()],
                                        opts.min_health_check_timeout_s)
        if opts.ignore_reads:
            report.notes += defaults.ignore_reads(doc)
    except (SettingError, ValueError) as e:
        raise WrapError(str(e)) from None
    return report


HEADER = ("# Wrapped by `berth llama-swap wrap`: each model's cmd runs under `berth run`, which\n"
          "# leases GPU memory from berthd and fronts the engine on the port llama-swap assigns.\n"
          "# Edit the source config and wrap it again (the source's YAML comments are not kept).\n")


def wrap_text(text: str, source: str = "CONFIG", opts: WrapOptions | None = None
              ) -> tuple[str, Report]:
    """Wrap llama-swap YAML text; returns the new YAML text and the report. Raises
    :class:`WrapError` (malformed YAML included, naming ``source``, line and column)."""
    try:
        doc = yamlio.load(text, source)
    except yamlio.YamlError as e:
        raise WrapError(str(e)) from None
    if doc is None:
        raise WrapError(f"{source}: empty; a llama-swap config needs 'models:'")
    try:
        report = wrap_config(doc, opts)
    except WrapError as e:
        raise WrapError(f"{source}: {e}") from None
    out = yamlio.dump(doc, HEADER)
    back = yamlio.load(out, "the output")
    if yamlio.dump(back) != yamlio.dump(doc):
        raise WrapError(f"{source}: the wrapped YAML does not read back as written")
    for (where, want), (_, got) in zip(yamlio.env_styles(doc), yamlio.env_styles(back), strict=True):
        if want != got:     # the emitter could not write it as the source did
            raise WrapError(f"{source}: {where.lstrip('.')}: holds ${{env.…}} and was written "
                            f"{_STYLE_WORDS[want]}, but wrapped it can only be written "
                            f"{_STYLE_WORDS[got]}, which would change the value llama-swap "
                            f"pastes in; quote it (\"…\") in the source")
    return out, report


def sizes_from(path: str | Path) -> dict[str, list[str]]:
    """``--size`` values per engine entry of a berth.toml: ``{"qwen": ["9GiB@gpu0"]}``; an
    entry without a size gives ``[]`` (berthd fills it from the entry). Raises
    :class:`berth.config.ConfigError` for a file berthd would refuse."""
    from berth.config import load
    cfg = load(path)
    raw = tomllib.loads(Path(path).read_text()).get("engines", {})
    out: dict[str, list[str]] = {}
    for name, entry in cfg.engines.items():
        if "size" not in entry.model_fields_set:
            out[name] = []
            continue
        size = str(raw[name]["size"])
        out[name] = [f"{size}@{entry.card}" if entry.card else size]
    return out
