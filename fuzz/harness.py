"""The atheris side of the fuzz suite: run targets of tests/fuzz/targets.py under libFuzzer.

The targets are the ones `make test` runs through hypothesis, so a crash found
here reproduces with `targets.TARGETS[name](input)`. A target swallows only its
parser's typed error; anything else it lets through is the crash libFuzzer
reports. Hangs and memory blow-ups are libFuzzer's `-timeout` and
`-rss_limit_mb` (the Makefile sets both).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import atheris  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parent.parent


def _seed(corpus: Path, names: Sequence[str], seeds: Callable[[str], list[bytes]]) -> None:
    """Fills an empty corpus directory with the golden vectors, so runs start from valid input."""
    if any(corpus.iterdir()):
        return
    for index, name in enumerate(names):
        prefix = bytes([index]) if len(names) > 1 else b""
        for i, data in enumerate(seeds(name)):
            (corpus / f"seed-{name}-{i}").write_bytes(prefix + data)


def main(names: Sequence[str]) -> None:
    """Fuzz the named targets; with several, the first input byte picks one."""
    sys.path.insert(0, str(REPO))
    with atheris.instrument_imports(include=["auditor"]):
        from tests.fuzz import targets
    chosen = [targets.TARGETS[name] for name in names]
    for arg in sys.argv[1:]:
        if not arg.startswith("-") and Path(arg).is_dir():
            _seed(Path(arg), names, targets.seeds)

    def one_input(data: bytes) -> None:
        if len(chosen) == 1:
            chosen[0](data)
        elif data:
            chosen[data[0] % len(chosen)](data[1:])

    atheris.Setup(list(sys.argv), one_input)
    atheris.Fuzz()
