"""Ledger id <-> znode path, for each of BookKeeper's ZooKeeper ledger managers.

Also the one rule for what a ledger id is (0..2^63-1, Java's non-negative
`long`), used wherever an id comes in from outside: a ledger znode's path, an
under-replication mark's name, a lock, a command-line argument. An id read from
ZooKeeper is untrusted like every other byte there: a path spelling 2^63 is a
bad znode to name, not a ledger to check.
"""

from __future__ import annotations

import re

from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager

#: Ids below this use the legacy (2-4-4) path in the hierarchical manager.
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


class InvalidLedgerIdError(ConfigError, ValueError):
    """A ledger id outside 0..2^63-1 (a ValueError too, as `ledger_path` always raised)."""


def is_valid_ledger_id(ledger_id: int) -> bool:
    """The rule: a ledger id is 0..2^63-1, whatever layout or tree names it."""
    return 0 <= ledger_id <= LONG_MAX


def check_ledger_id(ledger_id: int, *, where: str | None = None) -> int:
    """`ledger_id` if it is valid, else InvalidLedgerIdError (`where` names its source)."""
    if not is_valid_ledger_id(ledger_id):
        source = f"{where}: " if where else ""
        raise InvalidLedgerIdError(f"{source}a ledger id is 0..{LONG_MAX}, got {ledger_id}")
    return ledger_id


#: Children of the ledgers root (and names at leaf level) that are not ledgers.
SPECIAL_ZNODES = frozenset(
    {"available", "cookies", "LAYOUT", "INSTANCEID", "underreplication", "idgen", "idgen-long"}
)


def is_special_znode(name: str) -> bool:
    return name in SPECIAL_ZNODES or name.startswith("ID-")


def legacy_path(root: str, ledger_id: int) -> str:
    s = f"{ledger_id:010d}"
    return f"{root}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"


def long_path(root: str, ledger_id: int) -> str:
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def flat_path(root: str, ledger_id: int) -> str:
    return f"{root}/L{ledger_id:010d}"


def ledger_path(manager: LedgerManager, root: str, ledger_id: int) -> str:
    check_ledger_id(ledger_id)
    if manager is LedgerManager.FLAT:
        return flat_path(root, ledger_id)
    if manager is LedgerManager.LEGACY_HIERARCHICAL:
        return legacy_path(root, ledger_id)
    if manager is LedgerManager.LONG_HIERARCHICAL:
        return long_path(root, ledger_id)
    if ledger_id < INT_MAX:
        return legacy_path(root, ledger_id)
    return long_path(root, ledger_id)


_DIGITS = re.compile(r"\D")


def ledger_id_from_path(root: str, path: str) -> int:
    """The digits of every component after the root, as BookKeeper reads them.

    InvalidLedgerIdError (a ValueError) when they spell an id outside 0..2^63-1.
    """
    if not path.startswith(root + "/"):
        raise ValueError(f"{path} is not under {root}")
    digits = _DIGITS.sub("", path[len(root) + 1 :])
    if not digits:
        raise ValueError(f"no ledger id in {path}")
    return check_ledger_id(int(digits), where=path)
