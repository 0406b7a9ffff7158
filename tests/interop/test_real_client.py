"""The fixtures themselves, against real BookKeeper: a cluster of each ledger storage takes
ledgers from the real Java client in every shape the other interop tests rely on, and
gives every entry back; the znodes are where and what our metadata code reads."""

from __future__ import annotations

from auditor.metadata.serde import decode_ledger_metadata, encode_ledger_metadata
from auditor.zk import ZkClient
from tests.interop.conftest import MakeCluster

SHAPES = [
    # (ensemble, write, ack, digest, entries)
    (3, 3, 2, "CRC32", 10),
    (3, 2, 2, "CRC32C", 10),  # E > W: striped
    (3, 2, 1, "MAC", 7),
    (2, 2, 2, "DUMMY", 3),
    (3, 2, 2, "CRC32", 0),  # empty, closed
]


async def test_the_java_client_writes_and_reads_every_shape(real_cluster: MakeCluster) -> None:
    # One bookie of each ledger storage: every ensemble of three spans all three.
    cluster = real_cluster("sorted", "interleaved", "db")
    written: dict[int, tuple[str, int]] = {}
    for ensemble, write, ack, digest, entries in SHAPES:
        answer = cluster.client.ok(
            "create",
            ensemble=ensemble,
            write=write,
            ack=ack,
            digest=digest,
            password="secret",
            entries=entries,
        )
        written[answer["ledger"]] = (digest, entries)
    async with ZkClient(cluster.zk_hosts, timeout=10.0) as zk:
        for ledger, (digest, entries) in written.items():
            read = cluster.client.ok("read", ledger=ledger, digest=digest, password="secret")
            assert (read["entries"], read["lac"], read["mismatched"]) == (
                entries,
                entries - 1,
                [],
            )
            data, _ = await zk.get(f"{cluster.ledgers_root}/00/0000/L{ledger:04d}")
            md = decode_ledger_metadata(data, ledger)
            assert (md.last_entry_id, md.state.name) == (entries - 1, "CLOSED")
            # The client's MAC is the metadata format's HMAC.
            assert md.digest_type is not None
            assert md.digest_type.name == {"MAC": "HMAC"}.get(digest, digest)
            assert md.bookies() <= {b.bookie_id for b in cluster.bookies}
            # Byte-compatible: what Java wrote, we write back to the byte.
            assert encode_ledger_metadata(md) == data
