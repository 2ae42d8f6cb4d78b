"""tests/warm.py: the controller writes the bytecode the workers would each write at once."""

from __future__ import annotations

from _pytest.assertion import rewrite

from tests.warm import rewritten_files, warm


def test_warm_writes_pytests_rewritten_bytecode_once_and_the_packages_bytecode(
        request, tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helper.py").write_text("X = 1\n")
    (tmp_path / "test_x.py").write_text("def test_a():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "notes.py").write_text("")          # not a test module: not rewritten
    monkeypatch.setattr(request.config, "args", [str(tmp_path)])
    assert [p.name for p in rewritten_files(request.config)] == ["conftest.py", "test_x.py"]
    assert warm(request.config, [tmp_path / "pkg"]) == 2
    for name in ("test_x", "conftest"):
        pyc = tmp_path / "__pycache__" / (name + rewrite.PYC_TAIL)
        assert rewrite._read_pyc(tmp_path / f"{name}.py", pyc) is not None, pyc
    assert list((tmp_path / "pkg" / "__pycache__").glob("helper.*.pyc"))
    assert warm(request.config, [tmp_path / "pkg"]) == 0      # current: nothing rewritten again
