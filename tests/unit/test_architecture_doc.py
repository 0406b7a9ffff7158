"""docs/architecture.md names every module a newcomer meets, so that it stays the map.

A module added without a line there fails here, with the line to write named."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "auditor"
DOC = ROOT / "docs" / "architecture.md"


def _modules() -> list[str]:
    """Every module of the package, as a path under auditor/; package markers and the
    generated protobuf code aside."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" or rel.startswith("proto/"):
            continue
        found.append(rel)
    return found


def test_the_module_index_names_every_module() -> None:
    named = set(re.findall(r"^- `([\w/]+\.py)`: \S", DOC.read_text(), flags=re.MULTILINE))
    modules = _modules()
    assert len(modules) > 150  # the walk found the package
    missing = [m for m in modules if m not in named]
    assert missing == [], f"docs/architecture.md's module index lacks: {missing}"
    gone = sorted(named - set(modules))
    assert gone == [], f"docs/architecture.md's module index names modules no more: {gone}"
