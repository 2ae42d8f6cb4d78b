"""llama-swap's cmd parsing, redone in ``berth_hosts.llama_swap.command``: the POSIX split of
golib's shlex, comment lines, backslash continuations and the order of macro expansion
(llama-swap ``internal/config/commands.go``, ``macros.go``)."""

import shlex

import pytest
from berth_hosts.llama_swap import command


@pytest.mark.parametrize("text", [
    "llama-server --port 8080 -m /m/a.gguf",
    "  a\tb\nc  ",
    "sh -c 'exec llama-server --port 1 2>&1 | tee log'",
    'x "a b" \'c d\' e\\ f',
    '--samplers "top_k;top_p;min_p" --override-tensor "blk\\.(4[0-7])\\.ffn=CPU"',
    "a 'it''s' \"\" ''",
    'say "x \\" y" z\\\\w',
])
def test_split_posix_agrees_with_python_shlex_on_ordinary_commands(text):
    assert command.split_posix(text) == shlex.split(text)


def test_split_posix_follows_golib_where_python_differs():
    # Inside double quotes golib unescapes \$ and \` too; Python keeps the backslash.
    assert command.split_posix('"a\\$b"') == ["a$b"]
    # An unclosed quote runs to the end instead of raising.
    assert command.split_posix("a 'b c") == ["a", "b c"]
    # Backslash-newline vanishes (joins the words).
    assert command.split_posix("ab\\\ncd") == ["abcd"]
    # A carriage return is not whitespace in the POSIX dialect.
    assert command.split_posix("a\rb c") == ["a\rb", "c"]
    assert command.split_posix("") == []
    assert command.split_posix("''") == [""]


def test_sanitize_drops_comment_lines_and_joins_backslash_lines():
    text = "llama-server \\\n  # --n-cpu-moe 8 \\\n  --port 1 \\   \n  -m x\n# end"
    assert command.split_posix(command.sanitize(text)) == ["llama-server", "--port", "1", "-m", "x"]


def test_expand_follows_llama_swaps_order():
    globals_ = [("bin", "/opt/llama"), ("server", "${bin}/llama-server --port ${PORT}"),
                ("ctx", 4096), ("name", "${MODEL_ID}-x")]
    scope = command.scope("qwen", globals_, [("ctx", 8192), ("flag", True)])
    # the model's ctx replaces the global one in place; MODEL_ID goes first, so last to expand
    assert scope[0] == ("MODEL_ID", "qwen")
    assert ("ctx", 8192) in scope and ("ctx", 4096) not in scope
    text = command.expand("${server} -c ${ctx} --alias ${name} --x ${flag}", scope)
    assert text == "/opt/llama/llama-server --port ${PORT} -c 8192 --alias qwen-x --x true"


def test_argv_drops_comments_before_expanding_and_assigns_the_port():
    cmd = "# ${server} in a comment is never expanded\n${server}\n--model a.gguf"
    scope = command.scope("m", [("server", "llama-server --port ${PORT}")], [])
    assert command.argv(cmd, scope) == ["llama-server", "--port", "${PORT}", "--model", "a.gguf"]
    assert command.argv(cmd, scope, port="5800")[2] == "5800"


def test_open_quote_finds_the_quote_golib_leaves_open():
    assert command.open_quote("a 'b c") == 2
    assert command.open_quote('x "y \\" z') == 2           # \" does not close it
    assert command.open_quote("it's here") == 2             # opened inside a word
    assert command.open_quote("a 'b' \"c\" d\\'e") is None  # closed, and an escaped quote
    assert command.open_quote("'a\"b'") is None            # the other quote inside one
    assert command.open_quote("") is None
