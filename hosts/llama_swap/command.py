"""How llama-swap turns a model's ``cmd`` into argv, redone in Python.

Source: reference/llama-swap.md "How ``cmd`` is run"; llama-swap at ``0bdb372``:
``internal/config/macros.go`` (the order of expansion), ``internal/config/commands.go``
(``StripComments``, ``SanitizeCommand``) and the POSIX dialect of
``github.com/billziss-gh/golib/shlex``, which llama-swap splits with.

llama-swap's order, which :func:`argv` follows:

1. ``${env.NAME}`` is replaced in the whole YAML text (left as text here: it is the same
   before and after wrapping).
2. Lines of ``cmd`` whose trimmed text starts with ``#`` are dropped.
3. Macros are replaced as text, the model's own first, then the global ones in reverse order of
   declaration, then ``${MODEL_ID}`` (so a macro may use the macros declared before it).
4. ``${PORT}`` is replaced, if the expanded ``cmd`` contains it.
5. At start: comment lines are dropped again, a line ending in a backslash loses it and gains a
   space, and the text is split by POSIX rules (no shell, no ``$VAR``, no globs).

Berth needs this to find the engine's port and argv[0] in a ``cmd``, and to check that a
wrapped ``cmd`` splits to exactly ``berth run … -- <the engine's argv>``.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["Macros", "strip_comments", "sanitize", "split_posix", "open_quote", "macro_text",
           "scope", "expand", "argv", "PORT", "MODEL_ID"]

#: llama-swap's reserved macros in a model's values (``${PID}`` exists only in ``cmdStop``).
PORT, MODEL_ID = "${PORT}", "${MODEL_ID}"

#: Macros in declaration order: ``(name, value)``.
Macros = list[tuple[str, Any]]


def strip_comments(text: str) -> str:
    """``StripComments``: drop the lines whose trimmed text starts with ``#``."""
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("#"))


def sanitize(text: str) -> str:
    """``SanitizeCommand`` before the split: drop comment lines; a line ending in a backslash
    (after trimming) becomes the trimmed line without it, plus a space."""
    out = []
    for line in text.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith("#"):
            continue
        out.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    return "\n".join(out)


_SPACE, _WORD = " ", "A"
_NO_ESCAPE, _EMPTY = object(), object()


def _escape(state: str, r: str, r0: str | None):
    """The POSIX dialect's ``Escape``: what a backslash followed by ``r0`` stands for."""
    if r != "\\":
        return _NO_ESCAPE
    if state in (_SPACE, _WORD):
        return _EMPTY if r0 in ("\n", None) else r0
    if state == '"':
        if r0 in ("\n", None):
            return _EMPTY
        return r0 if r0 in '$`"\\' else _NO_ESCAPE
    return _NO_ESCAPE


def split_posix(text: str) -> list[str]:
    """Split like ``shlex.Posix.Split`` of ``billziss-gh/golib``: words split on space, tab and
    newline; ``'…'`` and ``"…"`` quote; a backslash escapes the next character (inside double
    quotes only ``$ ` " \\``); backslash-newline vanishes; an unclosed quote runs to the end
    (no error, unlike Python's :func:`shlex.split`; :func:`open_quote` finds one); no comments."""
    return _split(text)[0]


def open_quote(text: str) -> int | None:
    """Where the quote that :func:`split_posix` leaves open at the end of ``text`` starts (its
    index in ``text``), or ``None`` when every quote is closed. golib does not complain about
    one: the rest of the text becomes part of one word."""
    return _split(text)[1]


def _split(text: str) -> tuple[list[str], int | None]:
    tokens: list[str] = []
    token: list[str] | None = None
    state = [_SPACE]
    opened = 0
    i, n = 0, len(text)
    while i < n:
        r = text[i]
        i += 1
        r0 = text[i] if i < n else None
        s = state[-1]
        e = _escape(s, r, r0)
        if e is not _NO_ESCAPE:
            if r0 is not None:
                i += 1
            if e is _EMPTY:
                continue
        if s == _SPACE:
            if e is not _NO_ESCAPE:
                state.append(_WORD)
                token = (token or []) + [e]
            elif r in "\"'":
                state += [_WORD, r]
                token = []
                opened = i - 1
            elif r not in " \t\n":
                state.append(_WORD)
                token = (token or []) + [r]
        elif s == _WORD:
            if e is not _NO_ESCAPE:
                token.append(e)
            elif r in "\"'":
                state.append(r)
                opened = i - 1
            elif r in " \t\n":
                state.pop()
                tokens.append("".join(token))
                token = None
            else:
                token.append(r)
        else:                                   # inside quotes
            if e is not _NO_ESCAPE:
                token.append(e)
            elif r == s:
                state.pop()
            else:
                token.append(r)
    if token is not None:
        tokens.append("".join(token))
    return tokens, (opened if state[-1] not in (_SPACE, _WORD) else None)


def macro_text(value: Any) -> str:
    """A macro value as Go's ``%v`` prints it (``true``, ``4096``, ``0.7``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    return str(value)


def scope(model_id: str, global_macros: Macros, model_macros: Macros) -> Macros:
    """``mergeModelMacros``: ``MODEL_ID``, then the globals, a model macro replacing a global of
    the same name in place and the others appended."""
    merged: Macros = [("MODEL_ID", model_id), *global_macros]
    for name, value in model_macros:
        for i, (existing, _) in enumerate(merged):
            if existing == name:
                merged[i] = (name, value)
                break
        else:
            merged.append((name, value))
    return merged


def expand(text: str, macros: Iterable[tuple[str, Any]]) -> str:
    """``substituteMacroList`` on a string: replace ``${name}`` for each macro, last declared
    first. ``${PORT}``, ``${PID}`` and ``${env.…}`` are left as they are."""
    for name, value in reversed(list(macros)):
        text = text.replace("${%s}" % name, macro_text(value))
    return text


def argv(cmd: str, macros: Macros, port: str | None = None) -> list[str]:
    """The argv llama-swap would exec for ``cmd`` (steps 2–5 above); ``${PORT}`` becomes
    ``port`` when given, and stays ``${PORT}`` otherwise."""
    text = expand(strip_comments(cmd), macros)
    if port is not None:
        text = text.replace(PORT, port)
    return split_posix(sanitize(text))
