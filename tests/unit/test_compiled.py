"""The package must work as plain Python (editable installs, the pure wheel, any machine
without a C compiler), and the few modules the wheel compiles with mypyc must mean the same
compiled: a compiled module that shadowed its edited source, or that answered differently
from it, would be a bug no other test sees.

- The suite runs on the sources: no compiled module is in the tree (one left by
  `python -m bench.compiled build` would shadow every later edit of its source). With
  `BK_AUDITOR_TEST_COMPILED=1` it asserts the opposite, so the same tests can be run on
  the compiled modules: `python -m bench.compiled build`, then
  `BK_AUDITOR_TEST_COMPILED=1 pytest tests/unit/test_compiled.py <the modules' tests>`, then
  `python -m bench.compiled clean`.
- The build backend's decision (compile or not) follows `BK_AUDITOR_MYPYC` and the compiler.
- The pure wheel builds with no compiler involved and holds no extension.
- One small module (metadata/schedule.py), compiled here, gives the pure module's answers.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from itertools import product
from pathlib import Path
from types import ModuleType

import pytest

from auditor.metadata import schedule

REPO = Path(__file__).resolve().parents[2]
TEST_COMPILED = os.environ.get("BK_AUDITOR_TEST_COMPILED", "") == "1"


def _listed() -> list[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        paths = tomllib.load(f)["tool"]["bookkeeper-auditor"]["mypyc"]["modules"]
    return [str(p) for p in paths]


def _backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bk_build_backend", REPO / "build_support" / "backend.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiler() -> bool:
    return bool(_backend().compiler_found())


def test_compiled_list_is_of_existing_sources() -> None:
    listed = _listed()
    assert listed == sorted(set(listed))
    for path in listed:
        assert path.startswith("auditor/") and path.endswith(".py")
        assert (REPO / path).is_file(), path


def test_each_listed_module_is_imported_from_what_this_run_tests() -> None:
    """The sources (no stray .so shadowing them), or, in the compiled run
    (BK_AUDITOR_TEST_COMPILED=1), each listed module's compiled extension."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not TEST_COMPILED:
        stray = sorted(str(p.relative_to(REPO)) for p in (REPO / "auditor").rglob("*.so"))
        assert stray == [], "compiled modules shadow their sources: python -m bench.compiled clean"
    for path in _listed():
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        want = str(REPO / path.removesuffix(".py")) + suffix if TEST_COMPILED else str(REPO / path)
        assert module.__file__ == want


@pytest.mark.parametrize(
    ("switch", "expected"),
    [("0", False), ("pure", False), ("1", True), ("yes", True)],
)
def test_backend_switch(monkeypatch: pytest.MonkeyPatch, switch: str, expected: bool) -> None:
    monkeypatch.setenv("BK_AUDITOR_MYPYC", switch)
    assert _backend().compile_wanted() is expected


def test_backend_auto_follows_the_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    backend = _backend()
    monkeypatch.delenv("BK_AUDITOR_MYPYC", raising=False)
    assert backend.compile_wanted() is backend.compiler_found()
    monkeypatch.setenv("BK_AUDITOR_MYPYC", "auto")
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    assert backend.compiler_found() is False
    assert backend.compile_wanted() is False


def test_backend_refuses_an_unknown_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BK_AUDITOR_MYPYC", "sometimes")
    with pytest.raises(ValueError, match="BK_AUDITOR_MYPYC='sometimes'"):
        _backend().compile_wanted()


def _source_copy(dest: Path) -> Path:
    """What the sdist holds, copied (a build writes egg-info and build/ where it runs)."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "constraints.txt"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    for name in ("auditor", "proto", "build_support"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    return dest


@pytest.mark.slow
def test_pure_wheel_builds_without_mypyc(tmp_path: Path) -> None:
    src = _source_copy(tmp_path / "src")
    out = tmp_path / "dist"
    env = {**os.environ, "BK_AUDITOR_MYPYC": "0"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "-q",
            "--wheel",
            "--no-isolation",
            "-x",
            "--outdir",
            str(out),
        ],
        cwd=src,
        env=env,
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = out.iterdir()
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.endswith(".so")] == []
    assert all(path in names for path in _listed())


#: A grid of (first, last, ensemble, write quorum, index) with huge entry ids too.
_GRID = [
    (first, last, e, w, i)
    for (e, w), first, span in product(
        [(1, 1), (3, 2), (5, 2), (5, 5), (7, 3)], [0, 1, 4, 2**62 + 3], [-1, 0, 1, 5, 12]
    )
    for i in range(e)
    for last in (first + span,)
]


def _answers(module: ModuleType) -> list[list[object]]:
    return [
        [
            module.first_stored(first, last, e, w, i),
            module.last_stored(first, last, e, w, i),
            module.stores_entry(i, first, e, w),
            module.run_offset(e, w, i),
            module.write_set(first, e, w),
        ]
        for first, last, e, w, i in _GRID
    ]


_CHILD = """
import json, sys
from auditor.metadata import schedule
grid = json.loads(sys.stdin.read())
s = schedule
out = [[s.first_stored(*g), s.last_stored(*g), s.stores_entry(g[4], g[0], g[2], g[3]),
        s.run_offset(g[2], g[3], g[4]), s.write_set(g[0], g[2], g[3])] for g in grid]
print(json.dumps({"file": schedule.__file__, "answers": out}))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypyc") is None, reason="mypy (mypyc) absent")
def test_compiled_schedule_answers_as_the_pure_one(tmp_path: Path) -> None:
    if not _compiler():
        pytest.skip("no C compiler: nothing is compiled here")
    package = tmp_path / "auditor" / "metadata"
    package.mkdir(parents=True)
    (tmp_path / "auditor" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    shutil.copy2(REPO / "auditor" / "metadata" / "schedule.py", package / "schedule.py")
    build = (
        "from mypyc.build import mypycify\n"
        "from setuptools import Distribution\n"
        "d = Distribution({'name': 't', 'ext_modules': mypycify("
        "['auditor/metadata/schedule.py'], opt_level='3', separate=True)})\n"
        "d.script_name = 't'\n"
        "d.script_args = ['build_ext', '--inplace', '--quiet']\n"
        "d.parse_command_line()\n"
        "d.run_commands()\n"
    )
    subprocess.run(
        [sys.executable, "-c", build], cwd=tmp_path, check=True, capture_output=True, timeout=600
    )
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=tmp_path,
        input=json.dumps(_GRID),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    got = json.loads(child.stdout)
    assert got["file"] == str(package / "schedule") + sysconfig.get_config_var("EXT_SUFFIX")
    assert got["answers"] == _answers(schedule)
    assert len(got["answers"]) == 4 * 5 * 21  # firsts, spans, 21 indexes over five shapes
