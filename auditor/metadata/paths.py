"""Each ledger manager spells ledger ids in paths (or keys) its own way, and ids come in from
outside (znodes, marks, locks, the command line), where a bad one must be refused by one
rule.

Ledger id <-> znode path, for each of BookKeeper's ledger managers.

BookKeeper's ZooKeeper managers spell the id in decimal path components; its own etcd
driver (`LedgerManager.ETCD`) keys a ledger `<scope>/ledgers/<UUID>`, the
`java.util.UUID(0, ledgerId)` in its canonical text (`etcd_ledger_key`), whose fixed-width
lower-case hex sorts in id order.

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


#: The directory of ledger keys under an etcd scope (BookKeeper's `EtcdConstants.LEDGERS_NODE`).
ETCD_LEDGERS = "ledgers"
#: A ledger key's name as BookKeeper writes it: `UUID(0, id).toString()`, lower-case hex.
ETCD_LEDGER_NAME = re.compile(r"^00000000-0000-0000-([0-9a-f]{4})-([0-9a-f]{12})$")


def etcd_uuid(ledger_id: int) -> str:
    """`new java.util.UUID(0, ledgerId).toString()` (the id as the low 64 bits)."""
    low = ledger_id & 0xFFFFFFFFFFFFFFFF
    return f"00000000-0000-0000-{low >> 48:04x}-{low & 0xFFFFFFFFFFFF:012x}"


def etcd_ledger_key(scope: str, ledger_id: int) -> str:
    """BookKeeper's etcd key of a ledger (`EtcdUtils.getLedgerKey(scope, ledgerId)`)."""
    check_ledger_id(ledger_id)
    return f"{scope.rstrip('/')}/{ETCD_LEDGERS}/{etcd_uuid(ledger_id)}"


def etcd_ledger_id(name: str, *, where: str | None = None) -> int:
    """The ledger id of a ledger key's last component, as BookKeeper writes it.

    ValueError for a name that is not `UUID(0, id)` in canonical text (upper-case hex, a
    non-zero high half, any other shape: BookKeeper writes none of them, and names that
    are not in that one form do not sort in id order); InvalidLedgerIdError when its low
    half is a negative Java `long` (an id outside 0..2^63-1).
    """
    m = ETCD_LEDGER_NAME.match(name)
    if m is None:
        source = where or name
        raise ValueError(f"{source}: a ledger key's name is UUID(0, id) in lower-case hex")
    return check_ledger_id(int(m.group(1) + m.group(2), 16), where=where)


def ledger_path(manager: LedgerManager, root: str, ledger_id: int) -> str:
    check_ledger_id(ledger_id)
    if manager is LedgerManager.ETCD:
        return etcd_ledger_key(root, ledger_id)
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
    """The digits of every component after the root, as BookKeeper reads them; for a key
    `<root>/ledgers/<name>` of BookKeeper's etcd driver, the id its UUID name spells.

    InvalidLedgerIdError (a ValueError) when they spell an id outside 0..2^63-1; ValueError
    for a malformed etcd ledger key (`etcd_ledger_id`).
    """
    if not path.startswith(root + "/"):
        raise ValueError(f"{path} is not under {root}")
    rel = path[len(root) + 1 :]
    if rel.startswith(ETCD_LEDGERS + "/"):
        return etcd_ledger_id(rel[len(ETCD_LEDGERS) + 1 :], where=path)
    digits = _DIGITS.sub("", rel)
    if not digits:
        raise ValueError(f"no ledger id in {path}")
    return check_ledger_id(int(digits), where=path)
