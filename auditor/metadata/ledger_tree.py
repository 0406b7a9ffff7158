"""The ledgers root as a walk judges it, written once for the two walks that read it.

The ZooKeeper walk (`walk.py`: children, then batched reads) and the ranged walk
(`ranged_walk.py`: key ranges on etcd) must yield the same ledgers and name the same
unexpected znodes for the same tree, so the rules they judge by live here: the names of
each layout's levels (`FOUR`, `LEAF`, `FLAT_LEAF`, ...), the hierarchical trees
(`Tree`), the ids one walk covers (`IdRange`), and `ZnodeJudge`, which decides which
walk names a znode that is no ledger, and why, into the walk's `WalkStats`.

A znode that cannot be a ledger is never yielded and never stops a walk: it is an
`UnexpectedZnode` in `stats.unexpected`, named by path with the reason. That is one way
for every such znode, whether its name is not a ledger's, it is a ledger filed under the
other tree, or its path spells an id outside 0..2^63-1 (`invalid_ledger`: it stands
where a ledger would, and no ledger can be there). Such an id has no record to carry:
nothing downstream (the index, the checks' reports, the API) can hold it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from auditor.metadata.layout import LedgerManager
from auditor.metadata.paths import (
    INT_MAX,
    LONG_MAX,
    InvalidLedgerIdError,
    ledger_id_from_path,
)

_TWO = re.compile(r"^\d{2}$")
_THREE = re.compile(r"^\d{3}$")
FOUR = re.compile(r"^\d{4}$")
LEAF = re.compile(r"^L\d{4}$")
FLAT_LEAF = re.compile(r"^L\d{10}$")
#: A name shaped like a ledger's (L and digits), whatever the count of digits.
LEDGER_SHAPED = re.compile(r"^L\d+$")
#: The top directories of the hierarchical trees (2-4-4, 3-4-4-4-4).
TREE_TOP = re.compile(r"^\d{2,3}$")
WRONG_LAYOUT_FLAT = (
    "a hierarchical ledger directory, but LAYOUT names the flat ledger manager: "
    "no ledger under it is read"
)
WRONG_LAYOUT_HIERARCHICAL = (
    "a flat ledger znode, but LAYOUT names the hierarchical ledger manager: it is not read"
)
#: Unexpected znodes kept by path (all are counted): enough for an operator to go and look.
UNEXPECTED_KEPT = 100


@dataclass(frozen=True, slots=True)
class IdRange:
    """Ledger ids `lo <= id < hi`: one partition of a walk (a Spark task, say)."""

    lo: int
    hi: int

    def __contains__(self, ledger_id: int) -> bool:
        return self.lo <= ledger_id < self.hi

    @property
    def last(self) -> bool:
        """Whether this range runs to the end of the id space: it also walks the znodes
        whose paths spell ids beyond 2^63-1, so that they are named by exactly one range."""
        return self.hi > LONG_MAX

    def contains_prefix(self, digits: str, below: int) -> bool:
        """Whether a znode whose path spells `digits`, `below` digits short of an id, may
        hold ids in this range (every id under it lies in one decimal interval)."""
        scale: int = 10**below
        first = int(digits) * scale
        return (self.last or first < self.hi) and first + scale > self.lo


@dataclass(frozen=True, slots=True)
class Tree:
    """One hierarchical tree: the top level's name pattern and the digits of a full id."""

    top: re.Pattern[str]
    digits: int

    def below(self, prefix: str) -> int:
        return self.digits - len(prefix)


LEGACY_TREE = Tree(_TWO, 10)
LONG_TREE = Tree(_THREE, 19)


def trees_of(manager: LedgerManager) -> list[Tree]:
    """The trees of a hierarchical manager, in id order (flat has none)."""
    if manager is LedgerManager.LEGACY_HIERARCHICAL:
        return [LEGACY_TREE]
    if manager is LedgerManager.LONG_HIERARCHICAL:
        return [LONG_TREE]
    if manager is LedgerManager.HIERARCHICAL:
        return [LEGACY_TREE, LONG_TREE]
    return []


@dataclass(frozen=True, slots=True)
class UnexpectedZnode:
    """A znode under the ledgers root that the walk could not take as a ledger."""

    path: str
    reason: str
    #: It stands where a ledger would (`L` and digits at a ledger's level) but names no
    #: valid ledger: a bad ledger znode, where a stray name is merely unexpected.
    invalid_ledger: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def misnamed_reason(name: str, digits: int) -> str:
    """Why `L` and digits at a ledger's level is no ledger: the count of digits."""
    return f"a ledger's name here is L and {digits} digits, not {len(name) - 1}"


def out_of_range_reason(path: str, exc: InvalidLedgerIdError) -> str:
    """Why a ledger-shaped path is no ledger: the id it spells (the error names the path)."""
    return str(exc).removeprefix(f"{path}: ")


@dataclass
class WalkStats:
    """What the walk saw besides ledgers; a caller reports these, never drops them."""

    ledgers: int = 0
    deleted_during_walk: int = 0
    corrupt: int = 0
    #: The first UNEXPECTED_KEPT unexpected znodes, in walk order; all are counted below.
    unexpected: list[UnexpectedZnode] = field(default_factory=list)
    unexpected_count: int = 0
    #: How many of them are `invalid_ledger`.
    invalid_ledgers: int = 0

    @property
    def foreign_znodes(self) -> list[str]:
        """The paths of the unexpected znodes kept (what callers read before reasons)."""
        return [u.path for u in self.unexpected]

    def note_unexpected(self, znode: UnexpectedZnode) -> None:
        self.unexpected_count += 1
        if znode.invalid_ledger:
            self.invalid_ledgers += 1
        if len(self.unexpected) < UNEXPECTED_KEPT:
            self.unexpected.append(znode)


class ZnodeJudge:
    """The judgements of one walk of one ledgers root (`id_range`: None for the whole
    tree): which znodes it names, and the id of a ledger-shaped path. Every unexpected
    znode goes to `stats`."""

    def __init__(
        self, root: str, manager: LedgerManager, id_range: IdRange | None, stats: WalkStats
    ) -> None:
        self.root = root
        self.manager = manager
        self.id_range = id_range
        self.stats = stats

    def foreign(self, path: str, reason: str = "not a ledger znode") -> None:
        self.stats.note_unexpected(UnexpectedZnode(path, reason))

    def invalid(self, path: str, reason: str) -> None:
        self.stats.note_unexpected(UnexpectedZnode(path, reason, invalid_ledger=True))

    def owns(self, prefix: str, below: int) -> bool:
        """Whether this walk names the unexpected znodes in the directory spelling `prefix`:
        of the ranges that list it, the one holding the first id it could hold (so that
        partitions of one scan name each znode once)."""
        if self.id_range is None:
            return True
        first = int(prefix or "0") * 10**below
        return first in self.id_range or (first > LONG_MAX and self.id_range.last)

    def misnamed(self, path: str, name: str, digits: int) -> bool:
        """An `L` and a wrong count of digits: an invalid ledger znode; True if it was one."""
        if not LEDGER_SHAPED.match(name):
            return False
        self.invalid(path, misnamed_reason(name, digits))
        return True

    def ledger_id(self, path: str) -> int | None:
        """The id of a ledger-shaped path found by the walk, or None: it is named instead
        (an id beyond 2^63-1, a ledger filed under the other tree than its id's)."""
        try:
            ledger_id = ledger_id_from_path(self.root, path)
        except InvalidLedgerIdError as exc:
            # Only the last range gets here (the others prune such paths).
            self.invalid(path, out_of_range_reason(path, exc))
            return None
        legacy = path.count("/") - self.root.count("/") == 3
        if self.manager is LedgerManager.HIERARCHICAL and legacy != (ledger_id < INT_MAX):
            # A ledger filed under the other tree than its id says: the
            # Java manager would not find it by id either.
            tree = "legacy (2-4-4)" if legacy else "long (3-4-4-4-4)"
            self.foreign(path, f"ledger {ledger_id} filed under the {tree} tree, not its own")
            return None
        return ledger_id
