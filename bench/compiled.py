"""The compiled modules built in place, to measure them from the source tree (`make bench`
and `python -m bench` import the checkout's `auditor`), then removed again: a compiled
module left beside its source shadows every later edit of that source, so nothing here is
meant to stay (tests/unit/test_compiled.py fails while one is there).

    python -m bench.compiled build [PATH.py ...]   compile pyproject.toml's list, or PATHs
    python -m bench.compiled clean                 remove every compiled module again
    python -m bench.compiled status                which modules import compiled

The wheel compiles the same list the same way (setup.py: mypyc at opt level 3, one module
at a time). `BENCH_COMPILED=1 python -m bench` builds the list, runs the benchmarks and
cleans up, so a pure and a compiled run of the same command can alternate.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def listed_modules() -> list[str]:
    """pyproject.toml's `[tool.bookkeeper-auditor.mypyc] modules` (source paths)."""
    with open(REPO / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["bookkeeper-auditor"]["mypyc"]
    return [str(m) for m in table["modules"]]


def compiled_files() -> list[Path]:
    """Every extension module in the source tree (there are none but what `build` puts)."""
    return sorted(p for p in (REPO / "auditor").rglob("*.so"))


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def compiled_modules() -> list[str]:
    """The modules a compiled extension in the source tree stands for (none normally)."""
    names = {(*p.relative_to(REPO).parts[:-1], p.name.split(".")[0]) for p in compiled_files()}
    return sorted(".".join(parts) for parts in names if not parts[-1].endswith("__mypyc"))


def build(paths: list[str]) -> None:
    """mypyc-compiles `paths` (relative to the repository) into the source tree."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    clean()
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        extensions = mypycify(paths, opt_level="3", separate=True)
        dist = Distribution({"name": "bench-compiled", "ext_modules": extensions})
        dist.script_name = "bench-compiled"
        dist.script_args = ["build_ext", "--inplace", "--quiet"]
        dist.parse_command_line()
        dist.run_commands()
    finally:
        os.chdir(cwd)


def clean() -> None:
    for path in compiled_files():
        path.unlink()


def status() -> dict[str, bool]:
    """For each listed module: imported from a compiled extension (True) or its source."""
    sys.path.insert(0, str(REPO))
    out = {}
    for path in listed_modules():
        module = importlib.import_module(module_name(path))
        out[module.__name__] = not str(module.__file__).endswith(".py")
    return out


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "status"
    if command == "build":
        build(sys.argv[2:] or listed_modules())
        print(f"compiled in place: {[str(p.relative_to(REPO)) for p in compiled_files()]}")
    elif command == "clean":
        clean()
        print("compiled modules removed")
    elif command == "status":
        for name, compiled in status().items():
            print(f"{name}: {'compiled' if compiled else 'pure'}")
    else:
        raise SystemExit("usage: python -m bench.compiled build [PATH.py ...] | clean | status")


if __name__ == "__main__":
    main()
