"""A secured cluster is only as safe as the ACLs of the znodes the auditor relies on, and a
znode created earlier without credentials stays open to anyone, creator-only children or
not; nothing in ZooKeeper warns of that.

Which znodes the auditor relies on are open to anyone: ACLs are only as strong as parents.

With `zkEnableSecurity`, everything BookKeeper (and this daemon) creates gets creator-only
ACLs. But a znode created earlier, by a tool or a node without credentials, keeps the
open ACL it was created with: under an `underreplication` znode open to the world,
anyone may delete `lostBookieRecoveryDelay`, create `disable` (auto-recovery off for the
whole cluster), or plant votes and marks. A daemon started with credentials therefore
reads the ACLs of the znodes it relies on and names each one that lets an
unauthenticated client change it (`world:anyone` with any permission beyond READ).
Reading is harmless and expected: BookKeeper's own metadata is world-readable unless an
operator locks it down.

The judgement (`open_grants`) is a pure function of an ACL list; `find_open_acls` reads
them through a callable so that only ZooKeeper stores (which have ACLs) are asked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.store import NoNodeError

#: ZooKeeper's permission bits (`ZooDefs.Perms`), named as `getAcl` prints them.
PERMS = (("write", 2), ("create", 4), ("delete", 8), ("admin", 16))

#: The znodes under the ledgers root whose change by anyone silences or misleads the
#: auditor: the registrations it judges bookies by, the layout it reads ledgers with, and
#: the under-replication tree (marks, locks, the election, the delay, the `disable` switch).
RELIED_ON = (
    "",
    "/LAYOUT",
    "/available",
    "/available/readonly",
    "/underreplication",
    "/underreplication/ledgers",
    "/underreplication/locks",
    "/underreplication/auditorelection",
    "/underreplication/lostBookieRecoveryDelay",
)


@dataclass(frozen=True, slots=True)
class OpenAcl:
    """A relied-on znode whose ACL lets anyone change it, and what it lets them do."""

    path: str
    perms: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path} (anyone may {', '.join(self.perms)})"


def open_grants(acls: Sequence[Any]) -> tuple[str, ...]:
    """The permissions beyond READ that `acls` (kazoo `ACL`s: `perms`, `id.scheme`,
    `id.id`) grant to every client, authenticated or not; () when none."""
    granted = 0
    for acl in acls:
        if acl.id.scheme == "world" and acl.id.id == "anyone":
            granted |= int(acl.perms)
    return tuple(name for name, bit in PERMS if granted & bit)


async def find_open_acls(
    get_acls: Callable[[str], Awaitable[Sequence[Any]]], root: str
) -> list[OpenAcl]:
    """Every znode of `RELIED_ON` under `root` that anyone may change; a missing one (not
    created yet) is skipped: what this daemon creates gets its own ACL policy."""
    found: list[OpenAcl] = []
    base = root.rstrip("/")
    for rel in RELIED_ON:
        path = (base + rel) or "/"
        try:
            acls = await get_acls(path)
        except NoNodeError:
            continue
        perms = open_grants(acls)
        if perms:
            found.append(OpenAcl(path, perms))
    return found
