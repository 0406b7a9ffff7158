"""A deep scrub reads every byte a bookie stores; unpaced, it would take the disk and network
the bookie needs for its writers. How many bytes may go out per second is a rule of its own,
testable on a clock of its own, apart from the reads it paces.

A byte budget per bookie: `scrub.bytes_per_second`, as a token bucket that may go into debt.

A read's size is known only once it is answered, so a read is let go whenever the bucket is
not in debt, and its bytes are taken from the bucket afterwards (`spend`). The bucket refills
at the rate, up to one second's worth (the burst). A reader waits `delay()` before its next
read. Over any span of t seconds the bytes answered are at most `rate * t + burst` plus what
the reads in flight when the span ends bring (at most `checks.bookie_max_in_flight` entries):
the pacing test measures exactly that bound.

A rate of 0 means no budget: `delay()` is always 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ByteBudget"]


class ByteBudget:
    """One bookie's budget (see the module)."""

    __slots__ = ("_clock", "_stamp", "_tokens", "burst", "rate")

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        self.rate = float(rate)
        #: Bytes that may go out at once after a quiet second.
        self.burst = float(rate)
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def delay(self) -> float:
        """Seconds to wait before the next read (0 when the bucket is not in debt)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        debt = -self._tokens
        # Under a millionth of a byte is clock rounding, not debt (a wait that short would
        # not even move a float clock).
        return 0.0 if debt <= 1e-6 else debt / self.rate

    def set_rate(self, rate: float) -> None:
        """A new rate from now (the daemon's pace changes between chunks): what the old
        rate earned until now is kept, up to the new burst; a debt stays a debt."""
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        if self.rate > 0:
            self._refill()
        else:
            self._stamp = self._clock()
        self.rate = float(rate)
        self.burst = float(rate)
        self._tokens = min(self._tokens, self.burst)

    def spend(self, size: int) -> None:
        """Takes the bytes a read brought from the bucket."""
        if self.rate <= 0:
            return
        self._refill()
        self._tokens -= size
