"""`findings` (reports) and `tally` (the bounded list of a report's violations) both need
the violation, and neither should have to import the other's module for it.

One violation and the categories it can have: the smallest unit of a finding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Category(enum.StrEnum):
    # replicas (BP-34 durability contract)
    NO_REPLICA = "no_replica"
    BELOW_ACK_QUORUM = "below_ack_quorum"
    BELOW_WRITE_QUORUM = "below_write_quorum"
    BOOKIE_UNAVAILABLE_REGISTERED = "bookie_unavailable_registered"
    # progress of under-replication
    UNDERREPLICATED_PAST_GRACE_PERIOD = "underreplicated_past_grace_period"
    # placement policy
    PLACEMENT_NOT_ADHERING = "placement_not_adhering"
    PLACEMENT_SOFTLY_ADHERING = "placement_softly_adhering"
    # bookie check
    LEDGERS_ON_LOST_BOOKIES = "ledgers_on_lost_bookies"
    # ledger check
    UNREADABLE_FRAGMENTS = "unreadable_fragments"
    # deep scrub (`scrub`: every copy read and verified)
    CORRUPT_COPY = "corrupt_copy"
    DIVERGENT_COPIES = "divergent_copies"
    UNREADABLE_COPY = "unreadable_copy"
    # Pulsar audit (off by default: `pulsar-audit`)
    MISSING = "missing"
    ORPHAN = "orphan"
    DANGLING_CURSOR = "dangling_cursor"
    # every check
    METADATA_INVALID = "metadata_invalid"


@dataclass(frozen=True, slots=True)
class Violation:
    ledger_id: int
    category: Category
    bookie: str | None
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "category": str(self.category),
            "bookie": self.bookie,
            "detail": self.detail,
        }
