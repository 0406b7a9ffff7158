"""Leadership never ends silently, on a real ZooKeeper: every way out is a recorded decision.

A corrupt check-ctime znode and a bad `lostBookieRecoveryDelay` no longer cost the
leadership (they used to end the election task, or make every leader flap); a leader
whose work fails steps down and backs off, as its recorded decisions show; a daemon
whose election task dies says NOT_SERVING and exits non-zero; a second daemon with
the same identity refuses to vote and says so; an API token no client could send is
refused at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from auditor.api import LIVENESS, READINESS
from auditor.api.server import ApiServer, start_api_server
from auditor.checks.findings import ALL_CHECKS, Check
from auditor.daemon.contained import MAX_DELAY
from auditor.daemon.election import election_path
from auditor.daemon.leadership import Action, Phase, Reason, leader_backoff
from auditor.daemon.metrics import Metrics
from auditor.daemon.scheduler import CTIME_KIND
from auditor.daemon.service import EXIT_ELECTION_ENDED, Daemon
from auditor.metadata.records import (
    UNASSIGNED_CTIME,
    RereplicationLayout,
    encode_auditor_vote,
    encode_rereplication_layout,
)
from auditor.metadata.underreplication import UnderreplicationManager
from auditor.proto import auditor_service_pb2 as pb
from auditor.proto import auditor_service_pb2_grpc as pb_grpc
from auditor.testing.cli import bk
from auditor.testing.cluster import ClusterWriter
from auditor.testing.inprocess import fast_config, running, until
from auditor.testing.observe import events_of
from auditor.testing.watching import until_watched
from auditor.zk import ZkClient

ROOT = "/ledgers"
BASE = f"{ROOT}/underreplication"
VOTES = election_path(ROOT)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
Logs = list[MutableMapping[str, Any]]


async def first_round(daemon: Daemon, *, but: tuple[Check, ...] = ()) -> None:
    """Until every periodic check (all but `but`, which are off) has run once."""
    checks = [c for c in ALL_CHECKS if c not in but]
    await until(
        events_of(daemon).check_ended,
        lambda: all(daemon.state.checks[c].last_finished for c in checks),
        "the first round of checks",
        120,
    )


def reasons(daemon: Daemon) -> list[Reason]:
    return [d.reason for d in daemon.state.decisions]


def events(logs: Logs, name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels)
    return value


async def cluster(zk: ZkClient) -> UnderreplicationManager:
    await ClusterWriter(zk, ROOT).init_cluster()
    urm = UnderreplicationManager(zk, ROOT)
    await urm.check_layout()
    return urm


async def _api(control: Daemon) -> ApiServer:
    return await start_api_server(control, host="127.0.0.1", port=0, token=None)


# --- contained znodes ---------------------------------------------------------------------

CTIME_WARNING = "check time znode is corrupt; treating it as absent, the check runs"


async def test_corrupt_check_ctimes_count_as_absent_and_leadership_holds(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    """What another auditor version might leave: garbage in all three ctime znodes. The
    new leader runs the three checks at once (as if they never ran), warns once per
    znode, stores good ctimes over the garbage, and leads on."""
    urm = await cluster(zk)
    for kind in CTIME_KIND.values():
        await zk.create(f"{BASE}/{kind.znode}", b"\xff\x00not a protobuf\x07", makepath=True)
    started = time.time()
    async with running(fast_config(zk_hosts, "ctime:1"), Metrics()) as daemon:
        await first_round(daemon)
        for check, kind in CTIME_KIND.items():
            cs = daemon.state.checks[check]
            assert cs.last_error is None and cs.last_report is not None, check
            # The check ran at election, not an interval (an hour) after the garbage.
            assert cs.last_started is not None and cs.last_started >= started
            # Its time is stored over the garbage: the znode is good again.
            assert await urm.get_check_ctime(kind) >= int(started * 1000)
        warned = events(info_logs, CTIME_WARNING)
        assert sorted(e["znode"] for e in warned) == sorted(k.znode for k in CTIME_KIND.values())
        assert all("not a protobuf" in e["value"] for e in warned)
        assert daemon.state.invalid_znodes == {}
        for kind in CTIME_KIND.values():
            assert sample(daemon.metrics, "bookkeeper_auditor_znode_invalid", znode=kind.znode) == 0
        # Leadership held: one election, nothing ended it.
        assert daemon.state.is_leader and daemon.state.phase is Phase.LEADING
        assert reasons(daemon).count(Reason.ELECTED) == 1
        assert not any(d.ends_term for d in daemon.state.decisions)
        assert not events(info_logs, "no longer the auditor")


async def test_a_corrupt_ctime_of_a_check_that_is_off_shows_in_status_and_metric(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    """A check that does not run never overwrites its bad ctime: the daemon says so
    (status, gauge) for as long as it stays, after one warning."""
    urm = await cluster(zk)
    await zk.create(f"{BASE}/replicascheckctime", b"garbage", makepath=True)
    cfg = fast_config(zk_hosts, "ctime:2", ["auditorReplicasCheckInterval=0"])
    async with running(cfg, Metrics()) as daemon:
        await first_round(daemon, but=(Check.REPLICAS,))
        bad = daemon.state.invalid_znodes["replicascheckctime"]
        assert (bad.value, bad.using) == ("b'garbage'", "absent: the check runs as if it never ran")
        gauge = sample(
            daemon.metrics, "bookkeeper_auditor_znode_invalid", znode="replicascheckctime"
        )
        assert gauge == 1
        assert len(events(info_logs, CTIME_WARNING)) == 1
        # A triggered run stores a good ctime: the trouble is over, and says so.
        events_of(daemon).check_ended.clear()
        await daemon.trigger_check(Check.REPLICAS)
        await until(
            events_of(daemon).check_ended, lambda: daemon.state.invalid_znodes == {}, "repaired"
        )
        assert await urm.get_check_ctime(CTIME_KIND[Check.REPLICAS]) != UNASSIGNED_CTIME
        assert (
            sample(daemon.metrics, "bookkeeper_auditor_znode_invalid", znode="replicascheckctime")
            == 0
        )
        assert reasons(daemon).count(Reason.ELECTED) == 1


DELAY_WARNING = (
    f"lostBookieRecoveryDelay is not a whole number of seconds in 0..{MAX_DELAY}; "
    "using the configured value"
)


async def test_a_bad_lost_bookie_recovery_delay_falls_back_without_flapping(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    """`abc` used to fail every new leader at once, about nine elections a second. Now the
    configured delay is used, with one warning per bad value, and the leader stays."""
    await cluster(zk)
    delay_path = f"{BASE}/lostBookieRecoveryDelay"
    await zk.create(delay_path, b"abc", makepath=True)
    cfg = fast_config(zk_hosts, "delay:1", ["lostBookieRecoveryDelay=7"])
    async with running(cfg, Metrics()) as daemon:
        await first_round(daemon)
        work = daemon.work
        assert work is not None
        assert work.delay.delay_before_change == 7  # the configured value, not the znode's
        bad = daemon.state.invalid_znodes["lostBookieRecoveryDelay"]
        assert (bad.value, bad.using) == ("b'abc'", "the configured 7 s")
        gauge = "bookkeeper_auditor_znode_invalid"
        assert sample(daemon.metrics, gauge, znode="lostBookieRecoveryDelay") == 1
        assert [e["value"] for e in events(info_logs, DELAY_WARNING)] == ["b'abc'"]
        # The znode itself is left as it is: it is the operator's to fix.
        assert (await zk.get(delay_path))[0] == b"abc"

        async def write(value: bytes) -> None:
            await zk.set(delay_path, value)
            shown = repr(value)
            await until(
                events_of(daemon).znode_read,
                lambda: (
                    (z := daemon.state.invalid_znodes.get("lostBookieRecoveryDelay")) is not None
                    and z.value == shown
                ),
                f"the daemon read {shown}",
            )

        # Each new bad value: one more warning. Java's Integer.parseInt refuses 2^31.
        for value in (str(MAX_DELAY + 1).encode(), b"-5", b"1_0", b"\xff\xfe", b"-5"):
            await write(value)
        # The same bad value written again is not news.
        events_of(daemon).znode_read.clear()
        await zk.set(delay_path, b"-5")
        await asyncio.wait_for(events_of(daemon).znode_read.wait(), 30)
        assert len(events(info_logs, DELAY_WARNING)) == 6
        await zk.set(delay_path, b"12")
        await until(
            events_of(daemon).znode_read,
            lambda: (
                "lostBookieRecoveryDelay" not in daemon.state.invalid_znodes
                and work.delay.delay_before_change == 12
            ),
            "the daemon took the good value",
        )
        assert [e["value"] for e in events(info_logs, DELAY_WARNING)] == [
            "b'abc'",
            "b'2147483648'",
            "b'-5'",
            "b'1_0'",
            "b'\\xff\\xfe'",
            "b'-5'",
        ]
        assert sample(daemon.metrics, gauge, znode="lostBookieRecoveryDelay") == 0
        assert work.delay.delay_before_change == 12
        # One election all along, nothing ended it, the same work object.
        assert daemon.work is work
        assert reasons(daemon).count(Reason.ELECTED) == 1
        assert daemon.state.tallies.election_attempts == 1
        assert not any(d.ends_term for d in daemon.state.decisions)


# --- leader work failing ------------------------------------------------------------------


async def test_a_leader_whose_work_fails_steps_down_and_backs_off(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    """A layout this auditor must not work under (BookKeeper refuses it too) fails the
    leader's work on every election: each failure is a decision with its reason, and the
    next vote waits a growing, jittered back-off instead of flapping."""
    urm = await cluster(zk)
    await zk.set(f"{BASE}/LAYOUT", encode_rereplication_layout(RereplicationLayout("FANCY", 2)))
    backoff = leader_backoff(initial=0.2, maximum=0.8)
    cfg = fast_config(
        zk_hosts,
        "failing:1",
        ["daemon.leader_backoff_initial=0.2", "daemon.leader_backoff_max=0.8"],
    )
    async with running(cfg, Metrics()) as daemon:

        def backoffs() -> list[float]:
            return [d.backoff for d in daemon.state.decisions if d.action is Action.BACK_OFF]

        await until(
            events_of(daemon).decided, lambda: len(backoffs()) >= 4, "four failed terms", 60
        )
        log = list(daemon.state.decisions)
        terms = [d for d in log if d.reason in (Reason.ELECTED, Reason.LEADER_WORK_FAILED)]
        assert [d.reason for d in terms][:8] == [Reason.ELECTED, Reason.LEADER_WORK_FAILED] * 4
        failed = [d for d in log if d.reason is Reason.LEADER_WORK_FAILED]
        for n, d in enumerate(failed, 1):
            assert d.action is Action.BACK_OFF and d.phase is Phase.BACKING_OFF
            assert "only BASIC version 1 is supported" in d.detail
            top = backoff.ceiling(n)  # 0.2, 0.4, 0.8, then capped at 0.8
            assert top / 2 <= d.backoff <= top, (n, d.backoff)
        # Each next election came after the back-off, not before: no flapping.
        elected = [d for d in log if d.reason is Reason.ELECTED]
        for stepped, again in zip(failed, elected[1:], strict=False):
            assert again.at - stepped.at >= stepped.backoff
            between = [
                d
                for d in log
                if stepped.at <= d.at <= again.at and d.reason is not Reason.CONNECTED
            ]
            assert [d.reason for d in between] == [
                Reason.LEADER_WORK_FAILED,
                Reason.BACKOFF_ELAPSED,
                Reason.ELECTED,
            ]
        assert sample(
            daemon.metrics,
            "bookkeeper_auditor_leadership_decisions_total",
            reason="leader_work_failed",
        ) == len(backoffs())
        # The cause goes: the next election leads for good.
        await zk.set(f"{BASE}/LAYOUT", encode_rereplication_layout())
        await until(
            events_of(daemon).check_ended,
            lambda: daemon.state.checks[Check.BOOKIES].last_report is not None,
            "a check after the layout was repaired",
            60,
        )
        assert daemon.state.phase is Phase.LEADING
        await urm.check_layout(create=False)


# --- supervision --------------------------------------------------------------------------


async def test_a_daemon_whose_election_task_dies_exits_non_zero_not_serving_first(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    await cluster(zk)
    daemon = Daemon(fast_config(zk_hosts, "mortal:1"), metrics=Metrics())
    run = asyncio.ensure_future(daemon.run(api_factory=_api, signals=False))
    try:
        await until(
            events_of(daemon).decided, lambda: daemon.state.phase is Phase.LEADING, "leading", 30
        )
        assert daemon.api is not None and daemon.election is not None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{daemon.api.port}")
        health = health_pb2_grpc.HealthStub(channel)
        watches = {
            s: health.Watch(health_pb2.HealthCheckRequest(service=s), timeout=30)
            for s in (LIVENESS, READINESS)
        }
        for watch in watches.values():
            assert (await watch.read()).status == SERVING
        daemon.election.cancel()  # the election task dies, whatever the cause
        for service, watch in watches.items():
            assert (await watch.read()).status == NOT_SERVING, service
        code = await asyncio.wait_for(run, 30)
        await channel.close()
    finally:
        if not run.done():
            daemon.stop()
            await asyncio.gather(run, return_exceptions=True)
    assert code == EXIT_ELECTION_ENDED
    last = daemon.state.decisions[-1]
    assert (last.action, last.reason, last.phase) == (Action.FAIL, Reason.TASK_ENDED, Phase.ENDED)
    assert last.detail == "cancelled"
    assert "the election task ended" in last.message
    # NOT_SERVING was published (by the daemon, not by the server's own shutdown) before
    # anything began to stop.
    names = [e["event"] for e in info_logs]
    published = [
        i
        for i, e in enumerate(info_logs)
        if e["event"] == "health_changed" and e["status"] == "NOT_SERVING"
    ]
    assert published and published[0] < names.index("shutting down")
    assert {info_logs[i]["service"] for i in published} >= {LIVENESS, READINESS}
    # Its vote went with it: the next daemon is not kept waiting a session timeout.
    assert await zk.get_children(VOTES) == []


# --- duplicate identity -------------------------------------------------------------------

REFUSAL = (
    "another ZooKeeper session holds a vote with this daemon's identity; "
    "refusing to vote (give each daemon its own daemon.identity)"
)


async def _status(api: ApiServer) -> pb.GetStatusResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{api.port}") as channel:
        resp: pb.GetStatusResponse = await pb_grpc.AuditorServiceStub(channel).GetStatus(
            pb.GetStatusRequest(), timeout=10
        )
        return resp


async def _readiness(api: ApiServer) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{api.port}") as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=READINESS), timeout=10
        )
        return int(resp.status)


@contextlib.asynccontextmanager
async def _started(daemon: Daemon) -> AsyncIterator[asyncio.Task[int]]:
    run = asyncio.ensure_future(daemon.run(api_factory=_api, signals=False))
    try:
        yield run
    finally:
        daemon.stop()
        await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)


async def test_a_second_daemon_with_the_same_identity_refuses_to_vote(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    await cluster(zk)
    cfg = fast_config(zk_hosts, "twin:1")
    first = Daemon(cfg, metrics=Metrics())
    second = Daemon(cfg, metrics=Metrics())
    async with _started(first):
        await until(
            events_of(first).decided, lambda: first.state.phase is Phase.LEADING, "first leads"
        )
        [vote] = await zk.get_children(VOTES)
        async with _started(second):
            await until(
                events_of(second).decided, lambda: second.state.phase is Phase.REFUSED, "refused"
            )
            assert second.state.duplicate_vote == f"{VOTES}/{vote}"
            refusal = second.state.decisions[-1]
            assert (refusal.action, refusal.reason) == (Action.REFUSE, Reason.DUPLICATE_IDENTITY)
            assert refusal.detail == f"{VOTES}/{vote}"
            # No second vote, and the first daemon is untroubled.
            assert await zk.get_children(VOTES) == [vote]
            assert first.state.phase is Phase.LEADING and first.state.duplicate_vote is None
            # It says so: in its status, its metric, its readiness, and once in its log.
            assert second.api is not None and isinstance(second.api, ApiServer)
            status = await _status(second.api)
            assert (status.election_phase, status.duplicate_identity_vote) == (
                "refused",
                f"{VOTES}/{vote}",
            )
            assert status.HasField("duplicate_identity_since")
            assert status.decisions[-1].reason == "duplicate_identity"
            dup = "bookkeeper_auditor_duplicate_identity"
            assert (sample(second.metrics, dup), sample(first.metrics, dup)) == (1, 0)
            assert await _readiness(second.api) == NOT_SERVING
            # Other votes coming and going make it look again, not say it again.
            async with ZkClient(zk_hosts) as other:
                for _ in range(2):
                    path = await other.create(
                        f"{VOTES}/V_", encode_auditor_vote("other:1"), ephemeral=True, sequence=True
                    )
                    await other.delete(path)
            assert len(events(info_logs, REFUSAL)) == 1
            assert await zk.get_children(VOTES) == [vote]
            # The first one goes: the second votes, and leads.
            first.stop()
            await until(
                events_of(second).decided,
                lambda: second.state.phase is Phase.LEADING,
                "second leads",
            )
            assert [r for r in reasons(second) if r is not Reason.CONNECTED][-3:] == [
                Reason.DUPLICATE_IDENTITY,
                Reason.DUPLICATE_CLEARED,
                Reason.ELECTED,
            ]
            assert second.state.duplicate_vote is None
            assert sample(second.metrics, dup) == 0
            assert await _readiness(second.api) == SERVING


async def test_a_stale_vote_of_our_own_session_is_withdrawn_not_refused(
    zk: ZkClient, zk_hosts: str
) -> None:
    """A vote left by this very session (a resign that timed out) is ours: it is
    withdrawn before voting, not mistaken for a duplicate, nor left to stand in line
    ahead of our new vote."""
    await cluster(zk)
    async with running(fast_config(zk_hosts, "self:1")) as daemon:
        await until(events_of(daemon).decided, lambda: daemon.state.phase is Phase.LEADING, "leads")
        assert daemon.store is not None
        stale = await daemon.store.create(
            f"{VOTES}/deadbeefV_", encode_auditor_vote("self:1"), ephemeral=True, sequence=True
        )
        await daemon.step_down("test")
        await until(
            events_of(daemon).decided,
            lambda: reasons(daemon)[-2:] == [Reason.STEP_DOWN_REQUESTED, Reason.ELECTED],
            "stepped down and elected again",
        )
        assert await zk.exists(stale) is None
        assert Reason.DUPLICATE_IDENTITY not in reasons(daemon)


# --- start-up refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "why"),
    [("s3crét", "character 5 is a non-ASCII character (U+00E9)"), ("a\tb", "a control")],
)
async def test_a_token_no_client_can_send_is_refused_at_start(
    zk_hosts: str, token: str, why: str
) -> None:
    code, out, err = await bk(
        "run", "--zk", zk_hosts, "--set", "api.port=0", "--set", "metrics.enabled=false",
        "--set", f"api.token={token}", within=60,
    )  # fmt: skip
    assert (code, out) == (2, "")
    [line] = err.strip().splitlines()
    assert line.startswith("bk-auditor: error: api.token "), line
    assert why in line
    assert token not in line  # a secret is never echoed


# --- foreign votes ---------------------------------------------------------------------------

#: How long a daemon behind a foreign vote is watched for a loop: absence has no event.
QUIET = 3.0


async def test_a_foreign_v_1_leads_and_the_daemon_waits_behind_it_without_looping(
    zk: ZkClient, zk_hosts: str
) -> None:
    """A live vote named `V_1` (a short sequence: BookKeeper's comparator reads 1, kazoo's
    lock ranked it nowhere) holds the election, as Java's nodes would have it: the daemon
    votes once and waits, no election, no step-down, no ZooKeeper writes in a loop; it
    leads once that session ends."""
    await cluster(zk)
    async with ZkClient(zk_hosts) as other:
        await zk.ensure_path(VOTES)
        for _ in range(3):  # votes came and went before: ours will be V_...0005 or later
            await zk.delete(await zk.create(f"{VOTES}/V_", b"", ephemeral=True, sequence=True))
        await other.create(f"{VOTES}/V_1", encode_auditor_vote("java:3181"), ephemeral=True)
        daemon = Daemon(fast_config(zk_hosts, "behind:1"), metrics=Metrics())
        async with _started(daemon):
            await until(
                events_of(daemon).decided, lambda: daemon.state.phase is Phase.VOTING, "votes"
            )
            await until(
                events_of(daemon).leader_read, lambda: daemon.state.leader == "java:3181", "follows"
            )
            votes = await until_watched(
                lambda: zk.get_children_watched(VOTES), lambda v: len(v) == 2, 30, "our vote"
            )
            assert "V_1" in votes
            await asyncio.sleep(QUIET)
            assert Reason.ELECTED not in reasons(daemon), reasons(daemon)
            assert await zk.get_children(VOTES) == votes  # the same vote: not re-cast
            assert daemon.state.phase is Phase.VOTING
            assert daemon.state.unreadable_vote is None
            await other.close()
            await until(
                events_of(daemon).decided, lambda: daemon.state.phase is Phase.LEADING, "leads"
            )
            assert reasons(daemon).count(Reason.ELECTED) == 1


async def test_a_foreign_v_1_appearing_under_a_leader_ends_its_leadership_once(
    zk: ZkClient, zk_hosts: str
) -> None:
    """A leader, then a live `V_1` in the election (BookKeeper's order puts it ahead of a
    vote whose sequence is above 1): its holder is the auditor for every Java node and
    `whoisauditor`, so the daemon steps down once by the rule that elected it (before, a
    settled leader watched only its own vote and led on beside it: two auditors, found by
    the soak's `foreign_vote`), votes again behind it without a loop, and leads again once
    that session ends."""
    await cluster(zk)
    await zk.ensure_path(VOTES)
    for _ in range(3):  # votes came and went before: ours will be V_...0003 or later
        await zk.delete(await zk.create(f"{VOTES}/V_", b"", ephemeral=True, sequence=True))
    daemon = Daemon(fast_config(zk_hosts, "first:1"), metrics=Metrics())
    async with _started(daemon):
        # A leader well into its term (a check has run): the vote appears under a settled
        # leadership, not in the instant of its election.
        replicas = daemon.state.checks[Check.REPLICAS]
        await until(
            events_of(daemon).check_ended, lambda: replicas.last_finished is not None, "a check"
        )
        async with ZkClient(zk_hosts) as other:
            await other.create(f"{VOTES}/V_1", encode_auditor_vote("java:3181"), ephemeral=True)
            await until(
                events_of(daemon).decided, lambda: Reason.VOTE_LOST in reasons(daemon), "steps down"
            )
            await until(
                events_of(daemon).leader_read, lambda: daemon.state.leader == "java:3181", "follows"
            )
            await asyncio.sleep(QUIET)
            assert daemon.state.phase is Phase.VOTING
            assert reasons(daemon).count(Reason.ELECTED) == 1
            assert reasons(daemon).count(Reason.VOTE_LOST) == 1
        await until(
            events_of(daemon).decided, lambda: daemon.state.phase is Phase.LEADING, "leads again"
        )
        assert reasons(daemon).count(Reason.ELECTED) == 2


async def test_a_garbage_vote_first_in_line_is_said_loudly(
    zk: ZkClient, zk_hosts: str, info_logs: Logs
) -> None:
    """A live vote first in line whose bytes do not decode: no daemon leads (Java's would
    not either), and each says so: status names the znode and its session, a metric, an
    error in its log, readiness NOT_SERVING; when the session ends, the daemon leads and
    all of it clears."""
    await cluster(zk)
    async with ZkClient(zk_hosts) as other:
        await zk.ensure_path(VOTES)
        garbage = await other.create(
            f"{VOTES}/V_", b"\xff\xfe garbage", ephemeral=True, sequence=True
        )
        session = other.session
        assert session is not None
        metrics = Metrics()
        daemon = Daemon(fast_config(zk_hosts, "loud:1"), metrics=metrics)
        async with _started(daemon):
            await until(
                events_of(daemon).leader_read,
                lambda: daemon.state.unreadable_vote is not None,
                "noticed",
            )
            held = daemon.state.unreadable_vote
            assert held is not None
            assert (held.path, held.session) == (garbage, session)
            assert "vote" in held.error.lower()
            assert daemon.state.phase is Phase.VOTING and daemon.state.leader is None
            assert daemon.api is not None and isinstance(daemon.api, ApiServer)
            status = await _status(daemon.api)
            assert (status.unreadable_vote_path, status.unreadable_vote_session) == (
                garbage,
                session,
            )
            assert status.HasField("unreadable_vote_since")
            assert sample(metrics, "bookkeeper_auditor_election_vote_unreadable") == 1
            assert await _readiness(daemon.api) == NOT_SERVING
            said = events(
                info_logs,
                "election held by a vote that does not decode; nobody audits the cluster "
                "while its session lives",
            )
            assert [(e["znode"], e["session"]) for e in said] == [(garbage, f"0x{session:x}")]
            code, out, err = await bk("status", "--target", f"127.0.0.1:{daemon.api.port}")
            assert code == 0, err
            assert "auditor: none: the election is held by a vote that does not decode" in out
            assert (
                f"UNREADABLE VOTE: the election is held by {garbage} (session 0x{session:x}" in out
            )
            await other.close()
            await until(
                events_of(daemon).decided, lambda: daemon.state.phase is Phase.LEADING, "leads"
            )
            await until(
                events_of(daemon).leader_read,
                lambda: daemon.state.unreadable_vote is None,
                "cleared",
            )
            assert sample(metrics, "bookkeeper_auditor_election_vote_unreadable") == 0
            assert await _readiness(daemon.api) == SERVING
