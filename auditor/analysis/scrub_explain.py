"""`explain --scrub` answers "what does each bookie hold of this ledger, byte for byte, now":
the scrub's findings are per (category, bookie), but an operator looking at one ledger
wants every copy accounted for, sound ones and silent ones included. The fold from entry
verdicts to that account is pure, so it is here, apart from the reads.

Each copy's verdict of one ledger, per bookie, from the deep scrub's judge run now.

Why a fresh run and not the daemon's last scrub of the ledger: the daemon keeps no verdict
per ledger (its record is a cursor, small whatever the cluster's size; a chunk's report
holds only that chunk), and `explain` says what a check would see now, from fresh reads
(`explain_run.py`). The reads are the scrub's own (`ScrubRun.scrub`, paced by
`scrub.bytes_per_second`), the verdicts its judge's (`scrub.judge_entry`); nothing is
marked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from auditor.checks.scrub import EVIDENCE_LIMIT, EntryVerdict, entry_ranges

__all__ = ["CopyAccount", "ScrubAccount"]


@dataclass(slots=True)
class CopyAccount:
    """One bookie's copies of the ledger, by verdict."""

    verified: int = 0
    absent: int = 0
    silent: int = 0
    silent_reason: str | None = None
    #: Category -> entry -> reason (the smallest `EVIDENCE_LIMIT` entries kept).
    bad: dict[str, dict[int, str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verified": self.verified,
            "absent": self.absent,
            "silent": self.silent,
            "silent_reason": self.silent_reason,
        }
        for category in sorted(self.bad):
            kept = sorted(self.bad[category])[:EVIDENCE_LIMIT]
            out[category] = {
                "count": self.counts[category],
                "entries": entry_ranges(kept),
                "reasons": {str(e): self.bad[category][e] for e in kept},
            }
        return out


@dataclass(slots=True)
class ScrubAccount:
    """A ledger's copies, bookie by bookie, folded entry verdict by entry verdict."""

    entries: int = 0
    bytes_verified: int = 0
    bookies: dict[str, CopyAccount] = field(default_factory=dict)

    def _of(self, bookie: str) -> CopyAccount:
        acc = self.bookies.get(bookie)
        if acc is None:
            acc = self.bookies[bookie] = CopyAccount()
        return acc

    def add(self, v: EntryVerdict) -> None:
        self.entries += 1
        self.bytes_verified += v.bytes_verified
        for b in v.verified:
            self._of(b).verified += 1
        for b in v.absent:
            self._of(b).absent += 1
        for b, reason in v.silent.items():
            acc = self._of(b)
            acc.silent += 1
            acc.silent_reason = reason
        for f in v.findings:
            acc = self._of(f.bookie)
            category = str(f.category)
            acc.counts[category] = acc.counts.get(category, 0) + 1
            kept = acc.bad.setdefault(category, {})
            kept[f.entry_id] = f.reason
            if len(kept) >= 2 * EVIDENCE_LIMIT:
                acc.bad[category] = dict(sorted(kept.items())[:EVIDENCE_LIMIT])

    def categories(self) -> list[str]:
        return sorted({c for acc in self.bookies.values() for c in acc.counts})

    def to_json(self) -> dict[str, Any]:
        """The `scrub` object of `explain --scrub --json`."""
        return {
            "entries": self.entries,
            "bytes_verified": self.bytes_verified,
            "categories": self.categories(),
            "bookies": {b: self.bookies[b].to_json() for b in sorted(self.bookies)},
        }

    @staticmethod
    def text(doc: dict[str, Any]) -> list[str]:
        """`to_json`'s document as the text `explain` prints, one line per bookie."""
        lines = [
            f"  scrub (read now): {doc['entries']} entries, {doc['bytes_verified']} bytes "
            f"verified; {', '.join(doc['categories']) or 'every copy read is sound'}"
        ]
        for bookie, acc in doc["bookies"].items():
            parts = [f"verified {acc['verified']}"]
            for key in ("corrupt_copy", "unreadable_copy", "divergent_copies"):
                if key in acc:
                    entries = ",".join(
                        f"{a}-{b}" if a != b else f"{a}" for a, b in acc[key]["entries"][:6]
                    )
                    parts.append(f"{key} {acc[key]['count']} [{entries}]")
            if acc["absent"]:
                parts.append(f"absent {acc['absent']}")
            if acc["silent"]:
                parts.append(f"silent {acc['silent']} ({acc['silent_reason']})")
            lines.append(f"    {bookie:<24} {'; '.join(parts)}")
        return lines
