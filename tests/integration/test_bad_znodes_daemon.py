"""Bad znodes under the daemon: named in every report, in `status` and `report` over the API,
in `ListUnderReplicated` and in the metrics, while every check still completes.

The daemon runs in this process (its checks walk the leader's index, not ZooKeeper), on a
real ZooKeeper with emulated bookies, with corrupt under-replication marks and a ledger znode
at the path of id 2^63: the rows of docs/reliability.md's "Bad znodes" table whose handling
is the checks', the daemon's and the API's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from auditor.api.client import ApiClient
from auditor.api.convert import mark_of
from auditor.api.server import start_api_server
from auditor.checks.findings import ALL_CHECKS, Check, InvalidZnode
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.daemon.state import Outcome
from auditor.metadata.paths import LONG_MAX
from auditor.metadata.serde import encode_ledger_metadata
from auditor.metadata.underreplication import CorruptMark, UnderreplicatedLedger
from auditor.testing.cli import bk
from auditor.testing.cluster import make_metadata
from auditor.testing.harness import test_cluster
from auditor.testing.inprocess import fast_config, running
from auditor.zk import ZkClient
from tests.integration.test_bad_znodes import E, _marks_with_corrupt_ones

BEYOND = "/ledgers/922/3372/0368/5477/L5808"
BEYOND_WHY = f"a ledger id is 0..{LONG_MAX}, got {2**63}"
WALKING = (Check.BOOKIES, Check.LEDGERS, Check.PLACEMENT, Check.REPLICAS)
#: The emulated bookies share one rack: with this policy a healthy cluster is clean.
CLEAN = ("ensemblePlacementPolicy=DefaultEnsemblePlacementPolicy",)


async def _api(control: Daemon) -> Any:
    return await start_api_server(control, host="127.0.0.1", port=0, token=None)


async def _until(what: str, done: Callable[[], bool], within: float = 60) -> None:
    """Polls daemon state (no event marks a finished report) until `done`."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not reached in {within}s: {what}"
        await asyncio.sleep(0.1)


def _gauge(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


async def test_the_daemon_names_bad_znodes_in_reports_status_metrics_and_the_api(
    zk: ZkClient, info_logs: list[MutableMapping[str, Any]]
) -> None:
    async with test_cluster(zk, 3) as tc:
        for i in (1, 2, 3, 6):
            await tc.writer.write_ledger(i, tc.ids, write_quorum=2, num_entries=4)
        # Valid marks on 1 and 3, a minute old (within the grace period of FAST's hour).
        bad = await _marks_with_corrupt_ones(zk, int(time.time() * 1000) - 60_000)
        await zk.create(BEYOND, encode_ledger_metadata(make_metadata(5, E)), makepath=True)
        cfg = fast_config(zk.hosts, "bad-znodes:1", CLEAN)
        metrics = Metrics()
        async with running(cfg, metrics, api_factory=_api) as daemon:
            checks = daemon.state.checks
            await _until("first round", lambda: all(checks[c].last_finished for c in ALL_CHECKS))

            # Every check completed (none failed on a bad znode) and names what it read.
            for check in ALL_CHECKS:
                cs = checks[check]
                assert (cs.outcome, cs.last_error) == (Outcome.VIOLATIONS, None), check
                assert cs.last_report is not None and cs.last_report.violations.total == 0
            grace = checks[Check.GRACE].last_report
            assert grace is not None
            for check in WALKING:
                report = checks[check].last_report
                assert report is not None
                # The replicas check reads the marks too: it names the corrupt ones as well.
                marks = list(grace.invalid_znodes) if check is Check.REPLICAS else []
                listed = report.invalid_znodes.listed()
                assert sorted(listed, key=str) == sorted(
                    [*marks, InvalidZnode(BEYOND, BEYOND_WHY)], key=str
                )
                assert report.invalid_znodes.total == 1 + len(marks)
                assert report.ledgers_checked == (1 if check is Check.REPLICAS else 4), check
            grace = checks[Check.GRACE].last_report
            assert grace is not None and grace.ledgers_checked == 2
            assert [z.path for z in grace.invalid_znodes] == sorted(bad)
            replicas = checks[Check.REPLICAS].last_report
            assert replicas is not None and dict(replicas.ledgers_skipped) == {"underreplicated": 3}
            # The walking checks read the leader's index (its walker names them too).
            started = [e for e in info_logs if e["event"] == "check started"]
            assert {(e["check"], e["metadata"]) for e in started if e["check"] != "grace"} == {
                (str(c), "index") for c in WALKING
            }
            warned = [e for e in info_logs if e["event"] == "corrupt under-replication mark"]
            for name in ("grace", "replicas"):
                by = [e["path"] for e in warned if e.get("check") == name]
                assert sorted(by) == sorted(bad), name
            assert len(warned) == 2 * len(bad)

            # Metrics.
            for check in WALKING:
                named = 1 + (len(bad) if check is Check.REPLICAS else 0)
                assert _gauge(metrics, "bookkeeper_auditor_invalid_znodes", check=check) == named
            assert _gauge(metrics, "bookkeeper_auditor_invalid_znodes", check="grace") == len(bad)
            assert _gauge(metrics, "bookkeeper_auditor_underreplication_marks_invalid") == len(bad)
            assert (
                _gauge(
                    metrics, "bookkeeper_auditor_check_runs_total", check="grace", outcome="failed"
                )
                == 0
            )

            # `status` over the API: the count and the first ones per check.
            assert daemon.api is not None
            target = f"127.0.0.1:{daemon.api.port}"
            code, out, err = await bk("status", "--target", target, "--json")
            assert code == 0, err
            doc = json.loads(out)
            assert doc["checks"]["grace"]["invalid_znodes"] == {
                "total": len(bad),
                "listed": [{"path": p, "reason": z.reason} for p, z in zip(
                    sorted(bad), grace.invalid_znodes, strict=True
                )],
            }  # fmt: skip
            for check in WALKING:
                own = checks[check].last_report
                assert own is not None
                assert doc["checks"][str(check)]["invalid_znodes"] == {
                    "total": own.invalid_znodes.total,
                    "listed": [
                        {"path": z.path, "reason": z.reason} for z in own.invalid_znodes.listed()
                    ],
                }
            code, out, err = await bk("status", "--target", target)
            assert code == 0, err
            lines = [line.strip() for line in out.splitlines()]
            # The replicas check names the corrupt marks and the ledger znode; the others
            # the ledger znode; grace the corrupt marks.
            assert lines.count("invalid znodes: 1") == len(WALKING) - 1
            assert lines.count(f"invalid znodes: {1 + len(bad)}") == 1
            assert lines.count(f"invalid znodes: {len(bad)}") == 1
            assert lines.count(f"{BEYOND}: {BEYOND_WHY}") == len(WALKING)

            # `report` over the API: the report document, and the message's own fields.
            async with ApiClient(target, timeout=10) as api:
                resp = await api.report("grace")
                assert resp.invalid_znodes_total == len(bad)
                assert [z.path for z in resp.invalid_znodes] == sorted(bad)
                assert (
                    json.loads(resp.report_json)["invalid_znodes"] == grace.invalid_znodes.to_json()
                )
                # ListUnderReplicated: every valid mark and every corrupt one, in listing order;
                # corrupt ones pass any filter (their replicas cannot be read).
                items = [mark_of(m) async for m in api.underreplicated()]
                valid = [i for i in items if isinstance(i, UnderreplicatedLedger)]
                corrupt = [i for i in items if isinstance(i, CorruptMark)]
                assert [(u.ledger_id, u.replicas) for u in valid] == [(1, (E[0],)), (3, (E[0],))]
                assert [(c.path, c.ledger_id) for c in corrupt] == [
                    (p, None if p.endswith("urL9223372036854775808") else int(p[-10:])) for p in bad
                ]
                assert all(c.reason.startswith(bad[c.path]) for c in corrupt)
                filtered = [mark_of(m) async for m in api.underreplicated("nobody:3181")]
                assert filtered == corrupt
            code, out, err = await bk("report", "replicas", "--target", target)
            assert code == 0, err
            assert f"  invalid znode {BEYOND}: {BEYOND_WHY}" in out.splitlines()
