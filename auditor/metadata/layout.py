"""Where ledgers are kept, and how an id becomes a path, depend on the cluster's ledger
manager, which the walk, the marks and every path need to know before anything is read.

Which ledger manager a cluster uses, and where its ledgers root is.

Two sources say it: the ledgers-root `LAYOUT` znode (text
`<layoutFormatVersion>\\n<factoryClass-or-name>:<managerVersion>`, versions 1
and 2) and a metadata service URI such as `zk+hierarchical://h1:2181;h2:2181/ledgers`
(parsed in `auditor.metadata.service_uri`).
Class names are matched by suffix so that shaded names (Pulsar's `dlshade.`
prefix) resolve to the same manager.

BookKeeper's own etcd driver (`etcd://h1:2379/<scope>`) keeps the same LAYOUT
bytes at `<scope>/layout`, naming `org.apache.bookkeeper.metadata.etcd.EtcdLedgerManagerFactory`
at its version 0 (`LedgerManager.ETCD`: ledgers at UUID keys, see
`auditor.metadata.paths.etcd_ledger_key`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from auditor.errors import FormatError

DEFAULT_LEDGERS_ROOT = "/ledgers"
LAYOUT_FORMAT_VERSION = 2


class LedgerManager(enum.Enum):
    FLAT = "flat"
    LEGACY_HIERARCHICAL = "legacyhierarchical"
    HIERARCHICAL = "hierarchical"
    LONG_HIERARCHICAL = "longhierarchical"
    #: BookKeeper's own etcd driver: `<scope>/ledgers/<UUID(0, id)>`, no tree.
    ETCD = "etcd"


_CLASS_NAMES = {
    LedgerManager.FLAT: "org.apache.bookkeeper.meta.FlatLedgerManagerFactory",
    LedgerManager.LEGACY_HIERARCHICAL: (
        "org.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory"
    ),
    LedgerManager.HIERARCHICAL: "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory",
    LedgerManager.LONG_HIERARCHICAL: (
        "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory"
    ),
    LedgerManager.ETCD: "org.apache.bookkeeper.metadata.etcd.EtcdLedgerManagerFactory",
}
#: Each factory's current version (`getCurrentVersion()`), what a new cluster's LAYOUT says:
#: 1 for the ZooKeeper managers, 0 for the etcd one (`EtcdLedgerManagerFactory.VERSION`).
CURRENT_VERSIONS = {manager: 0 if manager is LedgerManager.ETCD else 1 for manager in _CLASS_NAMES}
# Longest suffix first: "HierarchicalLedgerManagerFactory" is a suffix of the
# legacy and long names too.
_BY_SUFFIX = sorted(_CLASS_NAMES.items(), key=lambda kv: -len(kv[1]))


class LayoutError(FormatError):
    """The LAYOUT znode names no ledger manager we can read."""


@dataclass(frozen=True, slots=True)
class Layout:
    manager: LedgerManager
    manager_version: int = 1
    layout_version: int = LAYOUT_FORMAT_VERSION

    @classmethod
    def current(cls, manager: LedgerManager) -> Layout:
        """The LAYOUT a new cluster of `manager` gets (its factory's current version)."""
        return cls(manager, CURRENT_VERSIONS[manager])

    def encode(self) -> bytes:
        """The LAYOUT bytes BookKeeper writes (format 2, no trailing newline)."""
        return (
            f"{self.layout_version}\n{_CLASS_NAMES[self.manager]}:{self.manager_version}".encode()
        )


def _manager_from_name(name: str) -> LedgerManager | None:
    for manager, cls in _BY_SUFFIX:
        short = cls.rsplit(".", 1)[1]
        if name in (cls, short) or name.endswith("." + short):
            return manager
    for manager in LedgerManager:
        if name == manager.value:
            return manager
    return None


_DIGITS = re.compile(r"[0-9]+")


def _java_int(text: str) -> int | None:
    """A non-negative `Integer.parseInt` value in ASCII digits, or None.

    `str.isdigit` is not enough: it accepts digits `int()` refuses (`²`), and
    `int()` refuses more than 4300 digits.
    """
    if _DIGITS.fullmatch(text) is None:
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > 10:
        return None
    value = int(digits)
    return value if value < 2**31 else None


def parse_layout(data: bytes) -> Layout:
    """Parses a ledgers-root LAYOUT znode."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LayoutError("LAYOUT is not UTF-8 text") from exc
    lines = text.split("\n")
    version = _java_int(lines[0].strip())
    if len(lines) < 2 or version is None:
        raise LayoutError(f"LAYOUT is not '<version>\\n<manager>:<version>': {text[:80]!r}")
    if not 1 <= version <= LAYOUT_FORMAT_VERSION:
        raise LayoutError(f"unsupported LAYOUT format version {version}")
    body = lines[1].strip()
    name, sep, mver = body.rpartition(":")
    manager_version = _java_int(mver)
    if not sep or manager_version is None:
        raise LayoutError(f"LAYOUT manager line is not '<manager>:<version>': {body[:80]!r}")
    manager = _manager_from_name(name)
    if manager is None:
        raise LayoutError(f"unknown ledger manager in LAYOUT: {name!r}")
    return Layout(manager, manager_version, version)
