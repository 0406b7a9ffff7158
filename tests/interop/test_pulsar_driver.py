"""Real BookKeeper on Apache Pulsar's metadata driver, beside our daemons.

The bookies, the Java client, BookieShell and Java's AutoRecovery run with
`org.apache.pulsar:pulsar-metadata` 4.0.7 on their class path and `metadata-store:zk:`
URIs, Pulsar's bookie and client drivers registered through the system properties Pulsar's
own scripts set (`realbk.PULSAR_DRIVER_PROPS`). Through that driver everything goes
through Pulsar's code: the cluster's format (no LAYOUT: `metadata/cluster.read_manager`),
the registry, the ledger manager, the election (one ephemeral key,
`<root>/underreplication/leader`, holding the leader's id as a JSON string), the marks and
the locks. Our side reads and writes them through the same `metadata-store:zk:` URI:

* the audit: a healthy cluster reports nothing; a stopped bookie's ledgers are marked
  exactly, and Java's shell lists those marks with their missing replica;
* one auditor at a time on Pulsar's key, whichever side, and both sides' `whoisauditor`
  name it; the leader stops, the other side leads;
* each side's worker repairs the other side's auditor's marks, under the shared locks,
  and the Java client reads every entry back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

from auditor.testing.cli import bk
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster
from tests.interop.realbk import NO_RACKS, RealCluster
from tests.interop.test_java_autorecovery import (
    JAVA_LEADS,
    JAVA_REPAIRED,
    SHAPES,
    assert_repaired,
    by_ledger,
    java_listing,
    java_listunderreplicated,
    leader_key_names,
    lost_bookie,
    marks_become,
    metadata,
    sides,
    the_lost_bookie,
    until_true,
    write_ledgers,
)


async def both_name(cluster: RealCluster, auditor: str) -> None:
    """BookieShell `whoisauditor` (Pulsar's driver reads the key) and ours name `auditor`,
    and ours says the election is Pulsar's."""
    java_out, (code, out, err) = await asyncio.gather(
        asyncio.to_thread(cluster.shell, "whoisauditor"),
        bk("whoisauditor", "--metadata-service-uri", cluster.uri, "--json", within=60),
    )
    assert re.findall(r"WhoIsAuditorCommand@\d+\] - Auditor: (\S+)$", java_out, re.M) == [auditor]
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["election"], doc["auditor"]) == ("pulsar", auditor)


async def test_the_audit_on_pulsars_driver_marks_what_java_lists(
    real_cluster: MakeCluster,
) -> None:
    """A cluster made through Pulsar's driver has no LAYOUT; `check all` on its
    `metadata-store:zk:` URI reads every ledger and finds nothing; a bookie stops and
    `check bookies --mark` marks exactly the ledgers it held, which Java's shell (on
    Pulsar's driver) lists with that missing replica, as ours does."""
    cluster = real_cluster("sorted", "interleaved", "sorted", driver="pulsar")
    written = await asyncio.to_thread(write_ledgers, cluster)
    async with ZkClient(cluster.zk_hosts, timeout=10.0) as zk:
        assert await zk.exists(f"{cluster.ledgers_root}/LAYOUT") is None
        ensembles = {w.ledger: (await metadata(zk, cluster.ledgers_root, w.ledger))[0].bookies()
                     for w in written}  # fmt: skip
    code, out, err = await bk(
        "check", "all", "--metadata-service-uri", cluster.uri, "--set", NO_RACKS, "--json",
        within=120,
    )  # fmt: skip
    assert code == 0, err
    reports = json.loads(out)["reports"]
    assert {name: r["violations_total"] for name, r in reports.items()} == dict.fromkeys(reports, 0)
    assert reports["bookies"]["ledgers_checked"] == len(written)

    lost = lost_bookie(cluster, written, ensembles)
    on_lost = sorted(ledger for ledger, bookies in ensembles.items() if lost in bookies)
    await asyncio.to_thread(cluster.bookie(lost).stop)
    code, out, err = await bk(
        "check", "bookies", "--mark", "--metadata-service-uri", cluster.uri, "--json",
        within=120,
    )  # fmt: skip
    assert code == 1, err
    report = json.loads(out)
    assert (report["lost_bookies"], sorted(report["marked_underreplicated"])) == ([lost], on_lost)
    async with ZkClient(cluster.zk_hosts, timeout=10.0) as zk:
        marks = await marks_become(zk, cluster.ledgers_root, {ledger: [lost] for ledger in on_lost})
    lines = await java_listunderreplicated(cluster, "-pmr")
    assert by_ledger(lines) == java_listing(marks, replicas=True)


async def test_one_auditor_on_pulsars_key_and_each_side_repairs_the_others_marks(
    real_cluster: MakeCluster,
) -> None:
    """Ours leads on Pulsar's key (our worker off); Java's AutoRecovery on Pulsar's driver
    follows; both `whoisauditor` name ours. A bookie stops: our auditor marks its ledgers
    and, once a spare bookie is up, Java's worker repairs them all: every entry reads back.
    Then ours stops: Java's auditor takes Pulsar's key, both name it; the spare stops,
    Java's auditor marks, Java stops, and a daemon of ours (worker on) repairs what Java
    marked."""
    cluster = real_cluster("sorted", "sorted", "sorted", driver="pulsar")
    root = cluster.ledgers_root
    written = await asyncio.to_thread(write_ledgers, cluster)
    async with sides(cluster, zkTimeout=4000) as (zk, start, java):
        before, lost, on_lost = await the_lost_bookie(cluster, zk, written)
        assert len(on_lost) == len(SHAPES) - 1

        ours = await start("ours", "--set", "worker.enabled=false")
        await leader_key_names(zk, root, ours.identity)
        await asyncio.to_thread(java.start)
        await both_name(cluster, ours.identity)
        assert JAVA_LEADS not in java.log_text()

        await asyncio.to_thread(cluster.bookie(lost).stop)
        await marks_become(zk, root, {ledger: [lost] for ledger in on_lost})
        spare = await asyncio.to_thread(cluster.add_bookie, "sorted")
        await marks_become(zk, root, {})
        versions = {ledger: before[ledger][1] for ledger in on_lost}
        await assert_repaired(cluster, zk, written, versions, lost, spare.bookie_id)
        assert sorted(map(int, JAVA_REPAIRED.findall(java.log_text()))) == sorted(on_lost)

        # Ours stops: its session ends, the key goes, Java's auditor takes it.
        assert await ours.stop() == 0
        await leader_key_names(zk, root, java.bookie_id)
        await until_true(lambda: JAVA_LEADS in java.log_text(), "Java's auditor starts")
        await both_name(cluster, java.bookie_id)

        # The spare stops in turn: it is in every ledger the first bookie was, beside the
        # two others, so no bookie is left to take its place and Java's worker cannot
        # repair; Java's auditor marks them.
        now = {w.ledger: await metadata(zk, root, w.ledger) for w in written}
        second = spare
        held = {ledger for ledger, (md, _) in now.items() if second.bookie_id in md.bookies()}
        assert held == on_lost
        await asyncio.to_thread(second.stop)
        await marks_become(zk, root, {ledger: [second.bookie_id] for ledger in held})
        # Java goes; a spare comes; a daemon of ours (its worker on) repairs Java's marks.
        await asyncio.to_thread(java.stop)
        replacement = await asyncio.to_thread(cluster.add_bookie, "sorted")
        await start("ours-2")
        await marks_become(zk, root, {})
        versions = {ledger: now[ledger][1] for ledger in held}
        # Every ledger is closed by now (the open ones were recovered in the first round,
        # with a segment more where recovery's last add went to the spare).
        closed = [dataclasses.replace(w, closed=True) for w in written]
        segments = {
            ledger: sum(second.bookie_id in seg.bookies for seg in md.segments)
            for ledger, (md, _) in now.items()
        }
        await assert_repaired(
            cluster, zk, closed, versions, second.bookie_id, replacement.bookie_id, segments
        )
