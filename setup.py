"""The wheel ships a few pure-computation modules compiled with mypyc where a C compiler is
present, because the replicas check runs them for every ledger and compiled they cost less
(bench/README.md, "mypyc: what each step bought"); everywhere else, and in every editable
install, the same package stays pure Python.

Everything about the package is in pyproject.toml; this file only adds the compiled modules
(pyproject.toml's `[tool.bookkeeper-auditor.mypyc] modules`, each also importable as plain
Python). Whether to compile is decided by `build_support/backend.py`, the PEP 517 backend
(setuptools' own, with that one decision added), and handed over in `_COMPILE_FLAG`: only a
wheel build sets it, so `pip install -e .`, sdists and metadata never run mypyc. The user's
switch is `BK_AUDITOR_MYPYC`: `auto` (default: compile when a C compiler and Python's
headers are there), `1` (compile or fail), `0` (pure).
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup

ROOT = Path(__file__).resolve().parent
#: Set by the backend for a wheel build: "1" compile, anything else pure.
_COMPILE_FLAG = "_BK_AUDITOR_COMPILE"


def compiled_modules() -> list[str]:
    """The source paths mypyc compiles, as pyproject.toml lists them."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["bookkeeper-auditor"]["mypyc"]
    return [str(m) for m in table["modules"]]


def ext_modules() -> list[Any]:
    """mypyc's extensions for a compiled wheel, or none for the pure package."""
    if os.environ.get(_COMPILE_FLAG) != "1":
        return []
    from mypyc.build import mypycify  # the build requirement the backend added

    modules = compiled_modules()
    print(f"bookkeeper-auditor: compiling {len(modules)} modules with mypyc", file=sys.stderr)
    # Compiled one by one, so that each module's compiled form only depends on itself (a
    # module not in the list, or a stale sibling, can never leave a broken import).
    return list(mypycify(modules, opt_level="3", separate=True))


setup(ext_modules=ext_modules())
