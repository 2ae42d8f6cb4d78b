"""CONTRIBUTING.md against the tree (issue 38): every file it links exists, every name it points
at in a file is defined there, the rules it states are the layout test's, and the README's
"Development" section leads to it. Its worked adapter is built and installed by
``tests/plugins/test_adapter_package.py``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def _links(text: str) -> list[str]:
    """Relative link targets, without their #anchor."""
    return [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)]+)\)", text)
            if not re.match(r"[a-z]+:", t)]


def test_every_link_is_a_file_of_the_checkout():
    missing = [t for t in _links(GUIDE) if not (ROOT / t).exists()]
    assert _links(GUIDE) and missing == []


def test_every_name_it_points_at_is_defined_in_its_file():
    """``[path](path) `Name` `` and ``[path](path)'s `_prefix*` ``: the name is defined there."""
    pairs = re.findall(r"\]\(([\w./-]+\.py)\)(?:'s)?\s+`([\w.*]+)`", GUIDE)
    assert len(pairs) >= 4, pairs
    for path, name in pairs:
        text = (ROOT / path).read_text(encoding="utf-8")
        last = name.rsplit(".", 1)[-1].rstrip("*")
        defined = rf"^\s*(?:async def|def|class) {re.escape(last)}|^{re.escape(last)}\b.*[:=]"
        assert re.search(defined, text, re.M), f"{path} defines no {name}"


def test_the_import_rules_it_states_are_the_layout_tests():
    layout = (ROOT / "tests" / "test_layout.py").read_text(encoding="utf-8")
    for test in re.findall(r"`(test_[a-z_]+)`", GUIDE):
        assert f"def {test}(" in (layout + (ROOT / "tests" / "plugins" /
                                            "test_adapter_registry.py").read_text()), test
    assert "test_no_import_circle" in GUIDE


def test_the_readme_points_to_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Development\n(.*?)(?=^## )", readme, re.S | re.M)
    assert section and "(CONTRIBUTING.md)" in section.group(1)
    assert "pip install -e '.[bench]'" in section.group(1)
