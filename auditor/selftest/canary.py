"""The self-test proves the analysis cores, but a finding also depends on the metadata walk,
metadata decoding, the bookie client on the wire, the rack source and the drivers; only
known-bad ledgers on the real cluster, run through the real drivers, prove that path.

The end-to-end canary: known-bad ledgers under a ledgers root of their own, real drivers.

The leader keeps a few synthetic ledgers under `selftest.canary_root` (never the real
ledgers root) and runs both drivers over that root with marking off:

* `NO_REPLICA_ID`: closed, entries 0..9, its ensemble the first (by id) up to
  three registered bookies, none of which holds it (it was never written):
  the replicas check must report `no_replica` with every one of them missing
  entries. The cost to the real bookies is one list request each per run.
* `ONE_RACK_ID`: closed and empty, two synthetic bookies of one rack in a
  write quorum: `placement_not_adhering` (empty, so no bookie is asked).
* `SPREAD_ID`: closed and empty, two racks: adheres (the clean control).
* `CORRUPT_ID`: bytes that do not decode: `metadata_invalid` in both checks.

Placement runs with a fixed rack-aware policy (two racks per write quorum)
and a rack map the canary writes under its root (Pulsar's format, the real
bookies each in a rack of their own), so its expectations never depend on
the cluster's own policy or rack sources. The ids sit just below 2^63, which
no BookKeeper id generator reaches, so no real ledger can answer for them.

Writes go through the leader's fenced view of the store; the canary rewrites a
znode only when its content must change (a different bookie set).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from auditor.checks.context import CheckContext
from auditor.checks.findings import Check, CheckReport
from auditor.checks.placement import PolicyKind
from auditor.errors import ConfigError
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import DigestType, LedgerMetadata, LedgerState, Segment
from auditor.metadata.paths import ledger_path
from auditor.metadata.registry import BookieSet, read_bookies
from auditor.metadata.serde import encode_ledger_metadata
from auditor.selftest.harness import FixtureFailure, SelfTestResult
from auditor.store import MetadataStore, NoNodeError

#: The canary's layout, whatever the cluster's (its root is ours).
CANARY_MANAGER = LedgerManager.HIERARCHICAL
_BASE = 2**63 - 2**20
NO_REPLICA_ID = _BASE + 1
ONE_RACK_ID = _BASE + 2
SPREAD_ID = _BASE + 3
CORRUPT_ID = _BASE + 4
CANARY_IDS = (NO_REPLICA_ID, ONE_RACK_ID, SPREAD_ID, CORRUPT_ID)
#: Where the canary's rack map lives, under its root (the walk ignores the name).
RACKS_NODE = "bk-auditor-canary-racks"
SYNTHETIC = ("bk-auditor-canary-1:3181", "bk-auditor-canary-2:3181", "bk-auditor-canary-3:3181")
CORRUPT = b"BookieMetadataFormatVersion\t3\n\x07bk-auditor canary: undecodable on purpose"
#: Entries the no-replica ledger claims.
ENTRIES = 10
#: `check` labels of the canary's results.
CANARY_REPLICAS = "canary_replicas"
CANARY_PLACEMENT = "canary_placement"


def validate_canary_root(canary_root: str, ledgers_root: str) -> None:
    """The canary root must be absolute and share no subtree with the real ledgers root."""
    if not canary_root.startswith("/") or canary_root.rstrip("/") == "":
        raise ConfigError(
            f"selftest.canary_root must be an absolute znode path, got {canary_root!r}"
        )
    a, b = canary_root.rstrip("/") + "/", ledgers_root.rstrip("/") + "/"
    if a.startswith(b) or b.startswith(a):
        raise ConfigError(
            f"selftest.canary_root {canary_root} overlaps the ledgers root {ledgers_root}; "
            "the canary needs a root of its own"
        )


def _md(ledger_id: int, bookies: Sequence[str], w: int, last: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        format_version=3,
        ensemble_size=len(bookies),
        write_quorum=w,
        ack_quorum=w,
        state=LedgerState.CLOSED,
        segments=(Segment(0, tuple(bookies)),),
        last_entry_id=last,
        length=(last + 1) * 10,
        digest_type=DigestType.CRC32C,
        password=b"",
    )


@dataclass(frozen=True, slots=True)
class CanaryLayout:
    """What the canary keeps under `root`, given the registered bookies it names."""

    root: str
    #: Registered bookies the no-replica ledger names (empty: that ledger is absent).
    bookies: tuple[str, ...]

    @classmethod
    def for_cluster(cls, root: str, registered: BookieSet) -> CanaryLayout:
        return cls(root.rstrip("/"), tuple(sorted(registered.available)[:3]))

    @property
    def racks_path(self) -> str:
        return f"{self.root}/{RACKS_NODE}"

    def ledgers(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        if self.bookies:
            w = min(2, len(self.bookies))
            out[NO_REPLICA_ID] = encode_ledger_metadata(
                _md(NO_REPLICA_ID, self.bookies, w, ENTRIES - 1)
            )
        out[ONE_RACK_ID] = encode_ledger_metadata(_md(ONE_RACK_ID, SYNTHETIC[:2], 2, -1))
        out[SPREAD_ID] = encode_ledger_metadata(_md(SPREAD_ID, SYNTHETIC[1:], 2, -1))
        out[CORRUPT_ID] = CORRUPT
        return out

    def racks(self) -> bytes:
        group: dict[str, dict[str, str]] = {
            SYNTHETIC[0]: {"rack": "/canary-rack-a"},
            SYNTHETIC[1]: {"rack": "/canary-rack-a"},
            SYNTHETIC[2]: {"rack": "/canary-rack-b"},
        }
        for i, b in enumerate(self.bookies):
            group[b] = {"rack": f"/canary-rack-real-{i}"}
        return json.dumps({"bk-auditor-canary": group}, sort_keys=True).encode()

    def expected(self, check: str) -> dict[int, tuple[str, ...]]:
        """Ledger id -> categories that check must report for it (empty: none)."""
        invalid = ("metadata_invalid",)
        if check == CANARY_REPLICAS:
            out: dict[int, tuple[str, ...]] = {CORRUPT_ID: invalid}
            if self.bookies:
                out[NO_REPLICA_ID] = ("no_replica",)
            return out
        out = {ONE_RACK_ID: ("placement_not_adhering",), SPREAD_ID: (), CORRUPT_ID: invalid}
        if self.bookies:
            out[NO_REPLICA_ID] = ()
        return out


async def _put(store: MetadataStore, path: str, data: bytes) -> None:
    try:
        current, stat = await store.get(path)
    except NoNodeError:
        await store.create(path, data, makepath=True)
        return
    if current != data:
        await store.set(path, data, version=int(stat.version))


async def write_canary(store: MetadataStore, layout: CanaryLayout) -> None:
    """Brings the canary's znodes to `layout` (`store`: the leader's fenced view)."""
    await _put(store, layout.racks_path, layout.racks())
    wanted = layout.ledgers()
    for ledger_id in CANARY_IDS:
        path = ledger_path(CANARY_MANAGER, layout.root, ledger_id)
        if ledger_id in wanted:
            await _put(store, path, wanted[ledger_id])
        elif await store.exists(path) is not None:
            await store.delete(path)


@dataclass
class CanaryContext(CheckContext):
    """A context over the canary root whose bookies are the cluster's registered ones."""

    registry_root: str = "/ledgers"

    async def registered(self) -> BookieSet:
        return await read_bookies(self.store, self.registry_root)


def canary_config(ctx: CheckContext, layout: CanaryLayout) -> Any:
    """The leader's config with the canary's fixed placement policy and rack map."""
    cfg = ctx.config
    bk = replace(
        cfg.bookkeeper,
        ensemblePlacementPolicy=PolicyKind.RACKAWARE.value,
        minNumRacksPerWriteQuorum=2,
        enforceMinNumRacksPerWriteQuorum=False,
        repairedPlacementPolicyNotAdheringBookieEnabled=False,
        networkTopologyScriptFileName="",
    )
    checks = replace(cfg.checks, racks_file="", racks_script="", racks_znode=layout.racks_path)
    return replace(cfg, bookkeeper=bk, checks=checks)


def judge(check: str, report: CheckReport, layout: CanaryLayout, seconds: float) -> SelfTestResult:
    """Compares a driver's report on the canary root with what the layout must give."""
    expected = layout.expected(check)
    got: dict[int, set[str]] = {}
    for v in report.violations:
        got.setdefault(v.ledger_id, set()).add(str(v.category))
    failures: list[FixtureFailure] = []
    for ledger_id in sorted(set(expected) | set(got)):
        want = sorted(expected.get(ledger_id, ()))
        have = sorted(got.get(ledger_id, set()))
        if want != have:
            failures.append(FixtureFailure(f"ledger {ledger_id}", repr(want), repr(have)))
    if check == CANARY_REPLICAS and layout.bookies:
        missing = sorted(
            m["bookie"]
            for v in report.violations
            if v.ledger_id == NO_REPLICA_ID and str(v.category) == "no_replica"
            for m in v.detail.get("missing", ())
        )
        if missing != sorted(layout.bookies):
            failures.append(
                FixtureFailure(
                    f"ledger {NO_REPLICA_ID} missing bookies",
                    repr(sorted(layout.bookies)),
                    repr(missing),
                )
            )
    if report.marked_underreplicated:
        failures.append(
            FixtureFailure("marks", "[]", repr(sorted(set(report.marked_underreplicated))))
        )
    details = {"ledgers_checked": report.ledgers_checked, "bookies": list(layout.bookies)}
    return SelfTestResult(check, len(expected), tuple(failures), seconds=seconds, details=details)


async def run_canary(ctx: CheckContext, canary_root: str) -> list[SelfTestResult]:
    """Writes the canary (fenced, through `ctx.store`), runs both drivers over it, judges.

    Uses the leader's bookie client (it resolves ids through the real
    registry) and never marks. The store's errors propagate to the caller.
    """
    from auditor.checks.runner import driver

    layout = CanaryLayout.for_cluster(canary_root, await ctx.registered())
    await write_canary(ctx.store, layout)
    cctx = CanaryContext(
        ctx.store,
        layout.root,
        CANARY_MANAGER,
        ctx.bookies,
        canary_config(ctx, layout),
        mark=False,
        clock=ctx.clock,
        log=ctx.log.bind(canary=layout.root),
        registry_root=ctx.root,
    )
    results: list[SelfTestResult] = []
    for check, which in ((CANARY_REPLICAS, Check.REPLICAS), (CANARY_PLACEMENT, Check.PLACEMENT)):
        started = time.monotonic()
        report = await driver(which)(cctx)
        results.append(judge(check, report, layout, time.monotonic() - started))
    if not layout.bookies:
        first = results[0]
        results[0] = replace(first, error="no registered bookie to name in the no_replica ledger")
    return results
