"""setuptools' PEP 517 backend with one decision added: a wheel is built with mypyc's
compiled modules when this machine can compile them, and stays pure Python otherwise, so
that the same `python -m build` (or `pip install .`) works with and without a C compiler.

Only a wheel build asks for mypy (the build requirement that brings mypyc) and compiles: an
editable install (`pip install -e .`, the dev venv), an sdist and the metadata hooks are
setuptools' own and never see mypyc. `BK_AUDITOR_MYPYC` decides: `auto` (the default)
compiles when a C compiler and Python's headers are found, `1` compiles or fails, `0` builds
the pure wheel. setup.py reads the outcome from `_BK_AUDITOR_COMPILE`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

#: What compiles: the mypy the project type-checks with (the dev venv's), so that what
#: mypyc accepts is what `make typecheck` accepts, and the stubs the compiled modules' types
#: come from (the rest of their imports are typed in the package or ignored by pyproject).
MYPYC_REQUIREMENTS = ("mypy==2.4.1", "types-protobuf==7.35.1.20260906")
_SWITCH = "BK_AUDITOR_MYPYC"
_COMPILE_FLAG = "_BK_AUDITOR_COMPILE"


def compiler_found() -> bool:
    """A C compiler as Python was built with (sysconfig's CC) and Python's headers."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths().get("include", "")
    return bool(cc) and shutil.which(cc[0]) is not None and Path(include, "Python.h").is_file()


def compile_wanted() -> bool:
    """Whether this wheel build compiles (`BK_AUDITOR_MYPYC`: auto, 1 or 0)."""
    switch = os.environ.get(_SWITCH, "auto").strip().lower()
    if switch in ("0", "no", "false", "pure"):
        return False
    if switch in ("1", "yes", "true"):
        return True
    if switch not in ("", "auto"):
        raise ValueError(f"{_SWITCH}={switch!r}: expected auto, 1 or 0")
    return compiler_found()


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = list(MYPYC_REQUIREMENTS) if compile_wanted() else []
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *extra]


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    wanted = compile_wanted()
    if wanted and os.environ.get(_SWITCH, "auto").strip().lower() in ("", "auto"):
        try:
            import mypyc.build  # noqa: F401 (present in an isolated build: requested above)
        except ImportError:
            # A non-isolated build (`python -m build -n`) without mypy: the pure wheel.
            print(f"{_SWITCH}=auto: no mypyc here, building the pure wheel", file=sys.stderr)
            wanted = False
    os.environ[_COMPILE_FLAG] = "1" if wanted else "0"
    try:
        return str(_setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))
    finally:
        del os.environ[_COMPILE_FLAG]
