"""Exponential back-off, capped, with optional jitter: one rule for every retry that waits.

Why: the daemon's leader (stepping down after failures), the bookie client (no new
connection to a bookie that just refused one), the standby index (started again
after it failed) and the replication worker (a failed ledger's lock held before it is
let go, upstream's schedule) each used to compute their own doubling wait; one tested
rule keeps them from drifting apart. Each keeps its own numbers, given as parameters.

Pure: no clock, no asyncio, no global random state. The caller counts failures in a
row (1 for the first) and asks what to wait; a draw with jitter takes the caller's
`random.Random`, so tests replay it with a seed.

The n-th failure in a row has the ceiling `min(maximum, initial * factor ** (n - 1))`,
and waits a draw from `[ceiling * (1 - jitter), ceiling]`: `jitter = 0` waits exactly
the ceiling, `jitter = 0.5` between half and all of it (the jitter spreads clients that
failed together; the lower bound keeps the wait growing).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The exponent is bounded before the power, so a long streak never overflows a float
#: (2 ** 64 is past every cap in use).
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """`initial` seconds after the first failure, times `factor` per failure in a row,
    never above `maximum`; `jitter` (0 to 1) is how far below that a draw may fall."""

    initial: float
    maximum: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0:
            raise ValueError(f"back-off times must be >= 0, got {self.initial}, {self.maximum}")
        if self.factor < 1:
            raise ValueError(f"back-off factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"back-off jitter must be within [0, 1], got {self.jitter}")

    def ceiling(self, failures: int) -> float:
        """The longest wait after `failures` failures in a row (0 or less counts as 1)."""
        exponent = min(max(failures - 1, 0), _MAX_EXPONENT)
        grown = self.initial * self.factor**exponent
        return float(self.maximum if grown >= self.maximum else grown)

    def draw(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after `failures` failures in a row: the ceiling, less up to `jitter`
        of it, drawn from `rng` (needed only when there is jitter)."""
        top = self.ceiling(failures)
        if self.jitter == 0:
            return top
        if rng is None:
            raise ValueError("a back-off with jitter draws from a random.Random; none given")
        return rng.uniform(top * (1 - self.jitter), top)
