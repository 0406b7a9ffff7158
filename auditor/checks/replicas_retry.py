"""BP-34 reports a bookie that does not answer only "even after subsequent delayed checks",
and a delay counted per ledger reported a bookie on its first silence (seed 5151 of the
soak); the delay has to be counted per bookie, in little memory per waiting ledger.

BP-34's delayed re-check, kept per (ledger, bookie): when a silent bookie may be reported.

The delay belongs to each bookie that falls silent, not to
the ledger: a ledger set aside because bookie A answered EIO, whose bookie B
crashes for two seconds just before A's last re-check, must not have B
reported on that one look (seed 5151 of the soak did, three times). So a
ledger's looks count, per bookie, how many looks in a row it has not answered
(its streak, `Silence`), and `RecheckRule` decides after each look:

- a silent bookie is *due* (reportable as `bookie_unavailable_registered`)
  once it has not answered on the look where it fell silent and on
  `checks.retry_attempts` delayed re-checks after it: a streak of
  `retry_attempts + 1`. A bookie that answers ends its streak; falling silent
  again starts a new one (a new silence, owed its own delay);
- the ledger is checked again after `checks.retry_delay` while some silent
  bookie is not due, at most `bound = 2 * retry_attempts` re-checks in all;
- then it is judged: the due bookies are reported, a silent bookie not due
  yet is not (it is logged and left to the next run, which gives it its
  delay from its first look).

Why twice `retry_attempts`: the bound must exist, since bookies that take
turns at being silent would otherwise keep a ledger re-checked for ever (each
new silence owed a new delay); and with 2R every bookie that falls silent
within the re-checks a ledger had anyway for its first silence (looks 0 to R)
gets all R of its own (by look 2R), which covers two faults overlapping (the
soak's case). A run's retry stage lasts at most twice as long as before, and
only for ledgers where a second bookie fell silent. A bookie that falls silent
after look R may have its re-checks cut short by the bound; it is then not
reported, never reported early: the bound can cost a late report (the next
run's), not a false alarm.

A scan's retry stages hand only ledger ids from stage to stage (the stages
may run on other executors): there `Silence.since_first` takes every bookie
silent at re-check N as silent on all N earlier looks, which is the rule
per ledger the scan had before (every silent registered bookie reported at
re-check `retry_attempts`).

The ledgers waiting for their next look are kept packed (`RetryQueue`): their
ids and the streaks of their silent bookies in flat arrays, bookie ids
interned, so the queue costs a few dozen bytes a ledger however many wait.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["NO_SILENCE", "RecheckRule", "RetryQueue", "Silence"]


@dataclass(frozen=True, slots=True)
class Silence:
    """A ledger's looks so far: how many, and each silent bookie's streak on the last one."""

    #: Looks at the ledger so far in this run (0 before its first).
    looks: int = 0
    #: (bookie, looks in a row it has not answered), for the bookies silent on the last look.
    streaks: tuple[tuple[str, int], ...] = ()
    #: Nothing is known of the earlier looks (a scan's retry stage): a bookie silent on the
    #: next look is taken as silent on every earlier one.
    since_first_look: bool = False

    @classmethod
    def since_first(cls, looks: int) -> Silence:
        """A ledger looked at `looks` times already, its history not kept (a scan stage:
        before its re-check N it has had N looks)."""
        return cls(looks, (), since_first_look=True)

    def after(self, silent: Iterable[str]) -> Silence:
        """The ledger after one more look, on which the bookies `silent` did not answer."""
        before = dict(self.streaks)
        return Silence(
            self.looks + 1,
            tuple(
                (b, (self.looks if self.since_first_look else before.get(b, 0)) + 1)
                for b in sorted(silent)
            ),
        )


#: A ledger not looked at yet in this run.
NO_SILENCE = Silence()


@dataclass(frozen=True, slots=True)
class RecheckRule:
    """When a ledger with silent bookies is looked at again, and which of them are due."""

    #: `checks.retry_attempts`: the delayed re-checks each silent bookie is owed.
    attempts: int

    @property
    def bound(self) -> int:
        """Delayed re-checks of one ledger in one run, at most (why 2R: the module)."""
        return 2 * self.attempts

    def due(self, silence: Silence) -> dict[str, int]:
        """The silent bookies owed no more re-checks, with their streaks."""
        return {b: n for b, n in silence.streaks if n > self.attempts}

    def waits(self, silence: Silence) -> bool:
        """Whether the ledger is looked at again: a silent bookie is not due, and the
        ledger has had fewer re-checks than the bound."""
        rechecks = silence.looks - 1
        return rechecks < self.bound and any(n <= self.attempts for _, n in silence.streaks)


class RetryQueue:
    """The ledgers waiting for their next look, with their silences, packed in flat arrays."""

    __slots__ = ("_bookies", "_ends", "_ids", "_index", "_looks", "_names", "_streaks")

    def __init__(self) -> None:
        self._ids: array[int] = array("q")
        self._looks: array[int] = array("L")
        #: Where each ledger's streaks end in `_bookies` / `_streaks` (exclusive).
        self._ends: array[int] = array("L")
        self._bookies: array[int] = array("L")
        self._streaks: array[int] = array("L")
        self._names: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, ledger_id: int, silence: Silence) -> None:
        """Queues a ledger (its history is kept: `since_first_look` is for a scan stage)."""
        self._ids.append(ledger_id)
        self._looks.append(silence.looks)
        for bookie, streak in silence.streaks:
            index = self._index.get(bookie)
            if index is None:
                index = self._index[bookie] = len(self._names)
                self._names.append(bookie)
            self._bookies.append(index)
            self._streaks.append(streak)
        self._ends.append(len(self._bookies))

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[int]:
        """The ledger ids, in the order they were queued (what a scan stage hands on)."""
        return iter(self._ids)

    def waiting(self) -> Iterator[tuple[int, Silence]]:
        """Each ledger id with its silence, in the order they were queued."""
        start = 0
        names, bookies, streaks = self._names, self._bookies, self._streaks
        for ledger_id, looks, end in zip(self._ids, self._looks, self._ends, strict=True):
            pairs = tuple((names[bookies[i]], streaks[i]) for i in range(start, end))
            yield ledger_id, Silence(looks, pairs)
            start = end
