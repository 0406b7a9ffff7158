"""Pulsar's auditor election on a real ZooKeeper, and the two elections kept apart.

A daemon whose metadataServiceUri is Pulsar's `metadata-store:zk:...` elects as Java
AutoRecovery with Pulsar's driver does: one ephemeral key `underreplication/leader`
holding the bookie id as a JSON string. Here the "Java node" is the test's own
ZooKeeper session writing that key as Pulsar writes it. A daemon of either driver
that sees a live holder in the other election stays out of leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import grpc

from auditor.api.server import ApiServer, start_api_server
from auditor.daemon.leadership import Action, Phase, Reason
from auditor.daemon.metrics import Metrics
from auditor.daemon.service import Daemon
from auditor.metadata.elections import (
    bookkeeper_election_path,
    decode_pulsar_leader,
    encode_pulsar_leader,
    pulsar_leader_path,
)
from auditor.metadata.records import encode_auditor_vote
from auditor.metadata.service_uri import MetadataDriver
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc
from auditor.testing.cli import bk
from auditor.testing.cluster import ClusterWriter
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.testing.watching import until_watched
from auditor.testing.zkdump import dump_tree
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
KEY = pulsar_leader_path(ROOT)
VOTES = bookkeeper_election_path(ROOT)
JAVA_ID = "10.0.0.9:3181"
#: The daemons' ZooKeeper session timeout (s): the take-over bound is this + 2 s.
SESSION = 6.0
Logs = list[MutableMapping[str, Any]]


def pulsar_config(hosts: str, identity: str) -> Any:
    """A daemon on Pulsar's driver: the URI carries the hosts (with the test's chroot)."""
    return fast_config(
        hosts,
        identity,
        [
            f"daemon.metadata_service_uri=metadata-store:zk:{hosts}",
            f"daemon.zk_session_timeout={SESSION}",
        ],
    )


def bookkeeper_config(hosts: str, identity: str) -> Any:
    return fast_config(hosts, identity, [f"daemon.zk_session_timeout={SESSION}"])


async def children_gone(zk: ZkClient, path: str, within: float = 10) -> None:
    """Until `path` has no children (a ZooKeeper child watch wakes each look)."""

    async def look() -> tuple[list[str], asyncio.Event]:
        return await zk.get_children_watched(path)

    await until_watched(look, lambda children: not children, within, f"{path} empty")


async def cluster(zk: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()


@contextlib.asynccontextmanager
async def java_pulsar_leader(hosts: str, identity: str = JAVA_ID) -> AsyncIterator[ZkClient]:
    """A Java AutoRecovery on Pulsar's driver leading: its own session holds the key."""
    async with ZkClient(hosts) as java:
        await java.create(KEY, encode_pulsar_leader(identity), ephemeral=True)
        yield java


@contextlib.asynccontextmanager
async def java_bookkeeper_voter(hosts: str, identity: str = JAVA_ID) -> AsyncIterator[str]:
    """A Java AutoRecovery on BookKeeper's driver: an ephemeral-sequential `V_` vote."""
    async with ZkClient(hosts) as java:
        await java.ensure_path(VOTES)
        path = await java.create(
            f"{VOTES}/V_", encode_auditor_vote(identity), ephemeral=True, sequence=True
        )
        yield path


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels)
    return value


async def _status(daemon: Daemon) -> pb.GetStatusResponse:
    assert isinstance(daemon.api, ApiServer)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.api.port}") as channel:
        resp: pb.GetStatusResponse = await pb_grpc.AuditorServiceStub(channel).GetStatus(
            pb.GetStatusRequest(), timeout=10
        )
        return resp


async def _api(control: Daemon) -> ApiServer:
    return await start_api_server(control, host="127.0.0.1", port=0, token=None)


def test_the_key_is_written_as_pulsar_writes_it() -> None:
    """Jackson's writeValueAsBytes of a String: the quotes, no newline, UTF-8."""
    assert encode_pulsar_leader("10.0.0.5:3181") == b'"10.0.0.5:3181"'
    assert decode_pulsar_leader(b'"bookie-1.example:3181"') == "bookie-1.example:3181"
    assert decode_pulsar_leader(b' "a:1" ') == "a:1"  # Jackson reads around white space too


async def test_a_pulsar_daemon_follows_a_java_leader_writes_nothing_and_takes_over(
    zk: ZkClient, zk_hosts: str
) -> None:
    await cluster(zk)
    async with java_pulsar_leader(zk_hosts) as java:
        java_session = java.client_id
        assert java_session is not None
        before = await dump_tree(zk, BASE)
        async with running(pulsar_config(zk_hosts, "pulsar-a:3181")) as daemon:
            assert daemon.driver is MetadataDriver.PULSAR
            await until(
                events_of(daemon).leader_read,
                lambda: daemon.state.leader == JAVA_ID,
                "follows the key",
            )
            assert daemon.state.phase is Phase.VOTING and not daemon.state.is_leader
            assert daemon.state.election == "pulsar"
            # Nothing written under underreplication while it waits: no vote, no
            # auditorelection directory, the key untouched.
            assert await dump_tree(zk, BASE) == before
            assert await zk.exists(VOTES) is None
            data, stat = await zk.get(KEY)
            assert (data, int(stat.ephemeralOwner)) == (b'"10.0.0.9:3181"', java_session[0])

            # The Java node goes: its session closes and the key with it.
            await java.close()
            gone = time.monotonic()
            await until(
                events_of(daemon).decided, lambda: daemon.state.is_leader, "takes over", SESSION + 2
            )
            assert time.monotonic() - gone < SESSION + 2
            assert daemon.store is not None and daemon.store.session is not None
            data, stat = await zk.get(KEY)
            assert data == b'"pulsar-a:3181"'
            assert int(stat.ephemeralOwner) == daemon.store.session
            assert await zk.exists(VOTES) is None

            # A second daemon of ours follows it, writing nothing either.
            before = await dump_tree(zk, BASE)
            async with running(pulsar_config(zk_hosts, "pulsar-b:3181")) as second:
                await until(
                    events_of(second).leader_read,
                    lambda: second.state.leader == "pulsar-a:3181",
                    "the second follows the first",
                )
                assert second.state.phase is Phase.VOTING
                assert daemon.state.is_leader and not second.state.is_leader
                after = await dump_tree(zk, BASE)
                # Only what the leader wrote meanwhile (its check times, marks): the
                # key is still the first daemon's, and nothing names the second.
                assert after[KEY] == before[KEY]
                assert not any(b"pulsar-b" in data for data, _, _ in after.values())

                # The leader stops: it deletes its key, and the second takes over.
                daemon.stop()
                await until(
                    events_of(second).decided, lambda: second.state.is_leader, "second leads"
                )
                data, _ = await zk.get(KEY)
                assert data == b'"pulsar-b:3181"'


async def test_a_bookkeeper_daemon_stays_out_while_pulsars_election_is_held(
    zk: ZkClient, zk_hosts: str
) -> None:
    """Nodes disagreeing on the driver: a zk:// daemon sees a live `leader` key and
    neither votes nor leads, says so (decision, status, metric), and leads once the
    key is gone."""
    await cluster(zk)
    async with java_pulsar_leader(zk_hosts) as java:
        metrics = Metrics()
        daemon = Daemon(bookkeeper_config(zk_hosts, "bk-a:3181"), metrics=metrics)
        run = asyncio.ensure_future(daemon.run(api_factory=_api, signals=False))
        try:
            await until(
                events_of(daemon).decided,
                lambda: daemon.state.phase is Phase.OTHER_ELECTION,
                "stays out",
            )
            refusal = daemon.state.decisions[-1]
            assert (refusal.action, refusal.reason) == (
                Action.REFUSE,
                Reason.OTHER_ELECTION_LEADER,
            )
            assert refusal.detail == f"{JAVA_ID} at {KEY}"
            assert await zk.exists(VOTES) is None or await zk.get_children(VOTES) == []
            other = daemon.state.other_election
            assert other is not None and (other.election, other.path, other.holder) == (
                "pulsar",
                KEY,
                JAVA_ID,
            )
            gauge = "bookkeeper_auditor_other_election_leader"
            assert sample(metrics, gauge, election="pulsar") == 1
            assert sample(metrics, "bookkeeper_auditor_election_info", election="bookkeeper") == 1
            status = await _status(daemon)
            assert (status.election_phase, status.election, status.other_election) == (
                "other_election",
                "bookkeeper",
                "pulsar",
            )
            assert (status.other_election_path, status.other_election_holder) == (KEY, JAVA_ID)
            assert not daemon.state.is_leader

            await java.close()
            await until(
                events_of(daemon).decided, lambda: daemon.state.is_leader, "leads", SESSION + 2
            )
            assert [d.reason for d in daemon.state.decisions][-2:] == [
                Reason.OTHER_ELECTION_CLEARED,
                Reason.ELECTED,
            ]
            assert sample(metrics, gauge, election="pulsar") == 0
            assert daemon.state.other_election is None
            assert await zk.exists(KEY) is None  # it never touched Pulsar's election
        finally:
            daemon.stop()
            await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)


async def test_a_pulsar_daemon_stays_out_while_bookkeepers_election_is_held(
    zk: ZkClient, zk_hosts: str
) -> None:
    await cluster(zk)
    voter = java_bookkeeper_voter(zk_hosts)
    vote = await voter.__aenter__()
    async with running(pulsar_config(zk_hosts, "pulsar-a:3181")) as daemon:
        try:
            await until(
                events_of(daemon).decided,
                lambda: daemon.state.phase is Phase.OTHER_ELECTION,
                "stays out",
            )
            assert daemon.state.decisions[-1].detail == f"{JAVA_ID} at {vote}"
            assert await zk.exists(KEY) is None
            assert await zk.get_children(VOTES) == [vote.rsplit("/", 1)[1]]
        finally:
            await voter.__aexit__(None, None, None)
        # The Java voter's session has closed: the daemon leads in Pulsar's election.
        await until(events_of(daemon).decided, lambda: daemon.state.is_leader, "leads", SESSION + 2)
        data, _ = await zk.get(KEY)
        assert data == b'"pulsar-a:3181"'


async def test_a_leader_steps_down_when_the_other_election_gets_a_holder(
    zk: ZkClient, zk_hosts: str
) -> None:
    await cluster(zk)
    async with running(bookkeeper_config(zk_hosts, "bk-a:3181")) as daemon:
        await until(events_of(daemon).decided, lambda: daemon.state.is_leader, "leads")
        assert len(await zk.get_children(VOTES)) == 1
        async with java_pulsar_leader(zk_hosts):
            await until(
                events_of(daemon).decided,
                lambda: daemon.state.phase is Phase.OTHER_ELECTION,
                "steps down and stays out",
            )
            # Its vote is withdrawn: seen from Pulsar's side, no BookKeeper auditor runs.
            await children_gone(zk, VOTES)
            assert not daemon.state.is_leader
            assert Reason.OTHER_ELECTION_LEADER in [d.reason for d in daemon.state.decisions]
        await until(events_of(daemon).decided, lambda: daemon.state.is_leader, "leads again")


async def test_a_key_of_another_session_with_our_identity_is_a_duplicate_not_taken(
    zk: ZkClient, zk_hosts: str
) -> None:
    """Pulsar's own rule deletes such a key as its stale one; we wait for it to go."""
    await cluster(zk)
    async with (
        java_pulsar_leader(zk_hosts, "twin:3181") as twin,
        running(pulsar_config(zk_hosts, "twin:3181")) as daemon,
    ):
        await until(
            events_of(daemon).decided, lambda: daemon.state.phase is Phase.REFUSED, "refused"
        )
        assert daemon.state.duplicate_vote == KEY
        assert twin.client_id is not None
        _, stat = await zk.get(KEY)
        assert int(stat.ephemeralOwner) == twin.client_id[0]
        await twin.close()
        await until(events_of(daemon).decided, lambda: daemon.state.is_leader, "leads", SESSION + 2)


async def test_whoisauditor_reads_both_elections(zk: ZkClient, zk_hosts: str) -> None:
    await cluster(zk)
    args = ("whoisauditor", "--zk", zk_hosts)
    async with java_pulsar_leader(zk_hosts):
        assert await bk(*args) == (0, f"{JAVA_ID} (Pulsar's election, key {KEY})\n", "")
        code, out, _ = await bk(*args, "--json")
        doc = {
            "auditor": JAVA_ID,
            "election": "pulsar",
            "path": KEY,
            "vote": None,
            "held_by_session": True,
        }
        assert (code, json.loads(out)) == (0, {**doc, "elections": [doc]})
        async with java_bookkeeper_voter(zk_hosts, "10.0.0.1:3181") as vote:
            code, out, err = await bk(*args)
            name = vote.rsplit("/", 1)[1]
            assert (code, out) == (
                1,
                f"10.0.0.1:3181 (BookKeeper's election, vote {name})\n"
                f"{JAVA_ID} (Pulsar's election, key {KEY})\n",
            )
            assert err.startswith("bk-auditor: two auditors: BookKeeper's election and Pulsar's")
            assert err.count("\n") == 1
    await zk.create(KEY, b"not json")
    code, out, err = await bk(*args)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and KEY in err and "not a JSON string" in err
