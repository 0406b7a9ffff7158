"""Run every ``bench/bench_*.py`` module's ``main()``, in name order."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path


def run() -> None:
    here = Path(__file__).parent
    for module in sorted(pkgutil.iter_modules([str(here)]), key=lambda m: m.name):
        if module.name.startswith("bench_"):
            importlib.import_module(f"bench.{module.name}").main()


if __name__ == "__main__":
    run()
