"""The body scanner finds a request's top-level ``model`` in a body read in pieces, wherever the
pieces split it (issue 26: a large body is spooled, not parsed whole)."""

from __future__ import annotations

import json

import pytest
from berth.gateway.body import ModelScanner

DOCS = [
    (b'{"messages": [{"role": "user", "content": "a \\"model\\": \\"x\\" {["}], '
     b'"model": "qw\\u00e9n", "z": 1}', "qw\u00e9n", None),
    (b'{"x": {"model": "inner"}, "model" : "outer"}', "outer", None),
    (b'{"model": 5, "a": 1}', None, "5"),
    (b'{"model": null}', None, None),
    (b'[{"model": "a"}]', None, None),
    (b'  {"a":"b\\\\","model":"m"}', "m", None),
]


@pytest.mark.parametrize("doc,model,invalid", DOCS)
def test_the_model_is_found_however_the_body_is_split(doc, model, invalid):
    assert isinstance(json.loads(doc), (dict, list))
    for i in range(len(doc) + 1):
        for j in (i, min(len(doc), i + 1), min(len(doc), i + 3)):
            s = ModelScanner()
            for piece in (doc[:i], doc[i:j], doc[j:]):
                if piece:
                    s.feed(piece)
            assert (s.model, s.invalid) == (model, invalid), (doc, i, j)


def test_a_large_string_before_the_model_is_skipped():
    s = ModelScanner()
    body = b'{"messages": [{"content": "' + b"QUJD" * (1 << 18) + b'"}], "model": "big"}'
    for k in range(0, len(body), 65536):
        s.feed(body[k:k + 65536])
    assert s.model == "big" and s.object
