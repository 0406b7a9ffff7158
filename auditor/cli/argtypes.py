"""Argument types the commands share: numbers an operator types, bounded at parse time.

argparse's `type=float` takes `inf`, `nan` and `1e308`: a timeout of `inf` then overflowed
deep in asyncio (exit 70, "internal error: OverflowError") and `nan` printed "within nans".
These refuse them with one line and exit 2, as any other bad argument.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: The longest timeout a command takes (seconds): a day is far past any useful wait.
MAX_TIMEOUT = 86400.0
#: The longest a command may be asked to run or wait for (seconds): thirty days.
MAX_DURATION = 30 * 86400.0


def seconds(limit: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, above 0 and at most `limit`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or not 0 < value <= limit:
            raise argparse.ArgumentTypeError(
                f"a number of seconds above 0 and at most {limit:g} is needed, got {text!r}"
            )
        return value

    return parse
