"""The bookie client against emulated bookies over real TCP, registered in a real ZooKeeper."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.bookie.availability import Availability
from auditor.bookie.client import BookieClient, ListBatch, decode_listing
from auditor.bookie.protocol import (
    AUTH_DISABLED_PLUGIN,
    BookieProtocolError,
    FrameParser,
    Operation,
    Status,
    auth_request,
    decode_response,
    encode_entry_body,
    encode_message,
    get_list_of_entries_request,
    master_key,
    read_entry_request,
    verify_entry_body,
)
from auditor.bookie.results import (
    CannotList,
    ErrorStatus,
    ListCapability,
    NoAnswer,
    Ok,
    Unanswered,
)
from auditor.metadata.model import DigestType
from auditor.metadata.registry import address_from_service_info, resolve_bookie, watch_bookies
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie import (
    BookieEmulator,
    Storage,
    default_body,
    make_body_factory,
    run_emulator,
)
from auditor.testing.zkserver import free_port
from auditor.zk import ZkClient

ROOT = "/ledgers"
READ = Operation.READ_ENTRY
LIST = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER

pytestmark = pytest.mark.timeout(60)

MakeEmulator = Callable[..., Awaitable[BookieEmulator]]
MakeClient = Callable[..., BookieClient]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
async def leak_check() -> AsyncIterator[None]:
    """Set up before (so torn down after) the client and emulators: nothing may be left running."""
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert left == [], f"tasks left running: {left}"


@pytest.fixture
async def emulators(zk: ZkClient, leak_check: None) -> AsyncIterator[MakeEmulator]:
    started: list[BookieEmulator] = []

    async def make(**kwargs: object) -> BookieEmulator:
        emu = BookieEmulator(zk, ledgers_root=ROOT, **kwargs)  # type: ignore[arg-type]
        await emu.start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        await emu.stop()


@pytest.fixture
async def clients(zk: ZkClient, leak_check: None) -> AsyncIterator[MakeClient]:
    made: list[BookieClient] = []

    def make(**kwargs: object) -> BookieClient:
        options: dict[str, object] = {
            "request_timeout": 1.0,
            "connect_timeout": 1.0,
            "backoff_initial": 0.0,
        }
        options.update(kwargs)
        client = BookieClient(
            functools.partial(resolve_bookie, zk, ROOT),
            **options,  # type: ignore[arg-type]
        )
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def emu(emulators: MakeEmulator) -> BookieEmulator:
    return await emulators()


@pytest.fixture
def client(clients: MakeClient) -> BookieClient:
    return clients()


async def raw_exchange(emu: BookieEmulator, *requests: pb.Request) -> list[pb.Response]:
    """Sends requests on a fresh connection and reads one response per request."""
    reader, writer = await asyncio.open_connection(*emu.address)
    try:
        for req in requests:
            writer.write(encode_message(req))
        parser = FrameParser()
        out: list[pb.Response] = []
        async with asyncio.timeout(5):
            while len(out) < len(requests):
                chunk = await reader.read(65536)
                assert chunk, "connection closed before every response arrived"
                out += [decode_response(p) for p in parser.feed(chunk)]
        return out
    finally:
        writer.close()
        await writer.wait_closed()


def body(ledger: int, entry: int, payload: bytes = b"payload") -> bytes:
    return encode_entry_body(ledger, entry, entry - 1, (entry + 1) * len(payload), payload)


# -- registration ------------------------------------------------------------------------------


async def test_emulator_registers_like_a_bookie(zk: ZkClient, emu: BookieEmulator) -> None:
    bookie = emu.bookie_id
    assert bookie == f"127.0.0.1:{emu.port}" and emu.port > 0
    data, stat = await zk.get(f"{ROOT}/available/{bookie}")
    assert stat.ephemeralOwner != 0
    assert address_from_service_info(data) == emu.address
    cookie = await zk.exists(f"{ROOT}/cookies/{bookie}")
    assert cookie is not None and cookie.ephemeralOwner == 0
    assert await resolve_bookie(zk, ROOT, bookie) == emu.address
    await emu.stop()
    assert await zk.exists(f"{ROOT}/available/{bookie}") is None
    assert await zk.exists(f"{ROOT}/cookies/{bookie}") is not None


async def test_read_only_registration_and_writes(
    zk: ZkClient, emulators: MakeEmulator, client: BookieClient
) -> None:
    emu = await emulators(readonly=True)
    bookie = emu.bookie_id
    assert await zk.exists(f"{ROOT}/available/readonly/{bookie}") is not None
    assert await zk.exists(f"{ROOT}/available/{bookie}") is None
    emu.put_ledger(3, range(5))
    assert await client.add_entry(bookie, 3, 5, body(3, 5)) == ErrorStatus(Status.EREADONLY)
    assert (await client.read_entry(bookie, 3, 4)).ok  # read-only bookies still serve reads
    await emu.set_readonly(False)
    assert await zk.exists(f"{ROOT}/available/{bookie}") is not None
    assert await zk.exists(f"{ROOT}/available/readonly/{bookie}") is None
    assert await client.add_entry(bookie, 3, 5, body(3, 5)) == Ok(5)
    await emu.set_readonly(True)
    assert await zk.exists(f"{ROOT}/available/readonly/{bookie}") is not None
    assert await zk.exists(f"{ROOT}/available/{bookie}") is None


# -- status paths ----------------------------------------------------------------------------


async def test_add_then_read_round_trips_bodies(emu: BookieEmulator, client: BookieClient) -> None:
    bookie = emu.bookie_id
    for e in range(3):
        assert await client.add_entry(bookie, 9, e, body(9, e), password=b"pw") == Ok(e)
    got = await client.read_entry(bookie, 9, 1)
    assert isinstance(got, Ok)
    assert got.value.body == body(9, 1)  # stored and returned byte for byte
    assert verify_entry_body(got.value.body, DigestType.CRC32C).payload == b"payload"
    assert got.value.max_lac == 1  # the LAC carried by the last entry (2)
    last = await client.read_entry(bookie, 9, -1)
    assert isinstance(last, Ok)
    assert last.value.entry_id == -1 and last.value.header.entry_id == 2
    # a different password is a different master key: the bookie refuses
    assert await client.add_entry(bookie, 9, 3, body(9, 3), password=b"other") == ErrorStatus(
        Status.EUA
    )
    # a body whose header names another entry is refused
    assert await client.add_entry(bookie, 9, 3, body(9, 4), password=b"pw") == ErrorStatus(
        Status.EBADREQ
    )


async def test_enoledger_versus_enoentry(emu: BookieEmulator, client: BookieClient) -> None:
    bookie = emu.bookie_id
    emu.put_ledger(4, [0, 1, 2])
    emu.put_ledger(8)  # exists, holds nothing
    assert await client.read_entry(bookie, 5, 0) == ErrorStatus(Status.ENOLEDGER)
    assert await client.read_entry(bookie, 4, 3) == ErrorStatus(Status.ENOENTRY)
    assert await client.read_entry(bookie, 8, -1) == ErrorStatus(Status.ENOENTRY)
    ok = await client.read_entry(bookie, 4, 2)
    assert isinstance(ok, Ok) and ok.value.body == default_body(4, 2)
    assert ok.answered and not ErrorStatus(Status.ENOLEDGER).ok


async def test_read_lac_quirk(emu: BookieEmulator, client: BookieClient) -> None:
    bookie = emu.bookie_id
    emu.put_ledger(4, range(10))
    emu.put_ledger(8)
    # unknown ledger: ENOENTRY, not ENOLEDGER (both lookups fail, then the override)
    assert await client.read_lac(bookie, 99) == ErrorStatus(Status.ENOENTRY)
    assert await client.read_lac(bookie, 8) == ErrorStatus(Status.ENOENTRY)
    got = await client.read_lac(bookie, 4)
    assert isinstance(got, Ok)
    assert got.value.lac_body is None
    assert got.value.last_entry is not None and got.value.last_entry.entry_id == 9
    assert got.value.last_entry_body == default_body(4, 9)


async def test_bookie_info_returns_only_requested_fields(
    emulators: MakeEmulator, client: BookieClient
) -> None:
    emu = await emulators(total_disk_capacity=1000, free_disk_space=400)
    bookie = emu.bookie_id
    both = await client.get_bookie_info(bookie)
    assert isinstance(both, Ok) and both.value.total_disk_capacity == 1000
    assert both.value.free_disk_space == 400
    total = await client.get_bookie_info(bookie, 1)
    assert isinstance(total, Ok) and total.value.free_disk_space is None
    free = await client.get_bookie_info(bookie, 2)
    assert isinstance(free, Ok) and free.value.total_disk_capacity is None
    none = await client.get_bookie_info(bookie, 0)
    assert isinstance(none, Ok) and none.value.total_disk_capacity is None


async def test_list_of_entries_on_a_sorted_bookie(
    emu: BookieEmulator, client: BookieClient
) -> None:
    bookie = emu.bookie_id
    # ensemble 3, write quorum 2, bookie 0: holds e with (0 - e) mod 3 < 2 -> 0,2,3,5,6,...
    entries = [e for e in range(3000) if (-e) % 3 < 2]
    emu.put_ledger(11, entries)
    emu.put_ledger(12, [range(0, 10_000_000)])
    emu.drop_entries(12, [range(100, 200), 5000])
    got = await client.get_list_of_entries(bookie, 11)
    assert got == Ok(Availability.from_entries(entries))
    big = await client.get_list_of_entries(bookie, 12)
    assert isinstance(big, Ok)
    assert big.value.total == 10_000_000 - 101
    assert big.value.group_count == 3
    assert list(big.value.iter_runs()) == [(0, 100), (200, 4800), (5001, 10_000_000 - 5001)]
    assert await client.get_list_of_entries(bookie, 13) == ErrorStatus(Status.ENOLEDGER)
    assert client.list_capability(bookie) is ListCapability.CAN_LIST


async def test_start_list_sends_without_a_task_and_answers_as_get_list_of_entries(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    """The hot path: once the bookie is known to list and connected, `start_list` sends
    from plain code (no task) under the same cap, with the same outcomes."""
    client = clients(max_in_flight=4)
    bookie = emu.bookie_id
    for ledger in range(1, 41):
        emu.put_ledger(ledger, range(ledger))
    # First contact: capability unknown, no connection: the slow path (a task).
    first = client.start_list(bookie, 1)
    assert isinstance(first, asyncio.Task)
    assert await first == Ok(Availability.from_entries(range(1)))
    assert client.list_capability(bookie) is ListCapability.CAN_LIST
    emu.set_latency(0.01)
    futures = [client.start_list(bookie, ledger) for ledger in range(1, 41)]
    # Four slots: four sent from plain code, the rest wait in tasks for a slot.
    assert sum(not isinstance(f, asyncio.Task) for f in futures) == 4
    assert client.in_flight(bookie) == 4
    got = await asyncio.gather(*futures)
    assert got == [Ok(Availability.from_entries(range(ledger))) for ledger in range(1, 41)]
    assert emu.max_in_flight == 4
    assert client.in_flight(bookie) == 0
    emu.set_latency(0)
    assert await client.start_list(bookie, 99) == ErrorStatus(Status.ENOLEDGER)
    emu.inject_status(Status.EIO, LIST)
    assert await client.start_list(bookie, 1) == ErrorStatus(Status.EIO)
    emu.inject_status(None)


async def test_start_lists_raw_answers_with_the_bytes_get_list_of_entries_decodes(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    """The replicas check's hot path: the same requests and cap as `start_list`, the
    outcomes gathered into one `ListBatch`, the availability's wire form in each answer
    (decoded by `decode_listing` to exactly `get_list_of_entries`' outcome); where a task
    sends it (capability not known yet, the cap full), the outcome is decoded."""
    client = clients(max_in_flight=4)
    bookie = emu.bookie_id
    for ledger in range(1, 21):
        emu.put_ledger(ledger, range(ledger))
    first = ListBatch()
    client.start_lists_raw(first, bookie, [1])
    await first.wait()
    assert first.outcomes == {(bookie, 1): Ok(Availability.from_entries(range(1)))}
    emu.set_latency(0.01)
    batch = ListBatch()
    client.start_lists_raw(batch, bookie, range(1, 21))
    await batch.wait()
    assert sorted(batch.outcomes) == [(bookie, ledger) for ledger in range(1, 21)]
    raw = 0
    for ledger in range(1, 21):
        out = batch.outcomes[bookie, ledger]
        assert isinstance(out, Ok)
        if isinstance(out.value, bytes):
            raw += 1
            assert decode_listing(bookie, ledger, out.value) == await client.get_list_of_entries(
                bookie, ledger
            )
        else:
            assert out == Ok(Availability.from_entries(range(ledger)))
    assert raw == 4  # the cap's four went out at once; the rest waited in tasks
    assert emu.max_in_flight == 4
    emu.set_latency(0)
    missing = ListBatch()
    client.start_lists_raw(missing, bookie, [99])
    await missing.wait()
    assert missing.outcomes == {(bookie, 99): ErrorStatus(Status.ENOLEDGER)}
    bad = decode_listing(bookie, 7, b"\x00" * 10)
    assert isinstance(bad, NoAnswer) and bad.reason is Unanswered.PROTOCOL_ERROR
    assert "undecodable availability for ledger 7" in bad.detail


async def test_a_list_batch_given_up_cancels_its_tasks_and_its_answers_return_their_slots(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    """A batch given up (the check cancelled) cancels the requests waiting in tasks; those
    already sent are left to their answers, which return the bookie's slots."""
    client = clients(max_in_flight=2)
    bookie = emu.bookie_id
    for ledger in range(1, 7):
        emu.put_ledger(ledger, range(3))
    warm = ListBatch()
    client.start_lists_raw(warm, bookie, [1])  # learns that the bookie lists
    await warm.wait()
    emu.pause()
    batch = ListBatch()
    client.start_lists_raw(batch, bookie, range(1, 7))
    waiting = asyncio.ensure_future(batch.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    batch.cancel()
    emu.resume()
    again = ListBatch()
    client.start_lists_raw(again, bookie, range(1, 7))
    await asyncio.wait_for(again.wait(), 10)
    assert all(isinstance(out, Ok) for out in again.outcomes.values())
    assert len(again.outcomes) == 6
    assert emu.max_in_flight <= 2
    # The given-up batch's two sent requests were answered; its four in tasks never went.
    assert dict(emu.list_requests) == {1: 3, 2: 2, 3: 1, 4: 1, 5: 1, 6: 1}


async def test_a_short_timeout_behind_a_long_one_expires_on_time(
    emu: BookieEmulator, client: BookieClient
) -> None:
    """Deadlines are swept per connection, not timed per request: a request with a short
    timeout sent after one with a long timeout still times out at its own deadline."""
    bookie = emu.bookie_id
    emu.put_ledger(4, range(3))
    assert (await client.read_entry(bookie, 4, 0)).ok  # connect first
    emu.pause()
    slow = asyncio.ensure_future(client.read_entry(bookie, 4, 1, request_timeout=30))
    await asyncio.sleep(0)  # the long one is sent first
    t0 = time.monotonic()
    fast = await client.read_entry(bookie, 4, 2, request_timeout=0.2)
    assert isinstance(fast, NoAnswer) and fast.reason is Unanswered.TIMEOUT
    assert 0.2 <= time.monotonic() - t0 < 0.8
    assert not slow.done()
    emu.resume()
    answered = await slow  # the long one is still pending, and answered
    assert isinstance(answered, Ok) and answered.value.header.entry_id == 1


async def test_start_list_times_out_and_fails_with_its_connection(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    client = clients(max_in_flight=2, list_timeout=0.2)
    bookie = emu.bookie_id
    emu.put_ledger(1, range(3))
    assert isinstance(await client.get_list_of_entries(bookie, 1), Ok)
    emu.pause()
    t0 = time.monotonic()
    late = client.start_list(bookie, 1)
    assert not isinstance(late, asyncio.Task)
    out = await late
    assert isinstance(out, NoAnswer) and out.reason is Unanswered.TIMEOUT
    assert 0.2 <= time.monotonic() - t0 < 0.8
    assert client.in_flight(bookie) == 0  # the slot came back with the timeout
    emu.resume()
    assert isinstance(await client.start_list(bookie, 1), Ok)
    assert client.unmatched_responses(bookie) == 1
    # A connection that drops fails what is pending on it, slot returned.
    emu.pause()
    dropped = client.start_list(bookie, 1)
    await emu.crash()
    out = await dropped
    assert isinstance(out, NoAnswer) and out.reason is Unanswered.DISCONNECTED
    assert client.in_flight(bookie) == 0


@pytest.mark.parametrize(
    "status",
    [Status.EUA, Status.ETOOMANYREQUESTS, Status.EIO, Status.EUNKNOWNLEDGERSTATE],
)
async def test_injected_statuses_reach_the_caller(
    emu: BookieEmulator, client: BookieClient, status: Status
) -> None:
    bookie = emu.bookie_id
    emu.put_ledger(4, range(3))
    emu.inject_status(status, READ)
    assert await client.read_entry(bookie, 4, 0) == ErrorStatus(status)
    assert (await client.read_lac(bookie, 4)).ok  # other operations unaffected
    emu.inject_status(status)  # every operation
    for outcome in (
        await client.read_lac(bookie, 4),
        await client.get_bookie_info(bookie),
        await client.get_list_of_entries(bookie, 4),
        await client.add_entry(bookie, 4, 3, body(4, 3)),
    ):
        assert outcome == ErrorStatus(status)
        assert outcome.answered
    emu.clear_faults()
    assert (await client.read_entry(bookie, 4, 0)).ok
    # an error status is an answer: it says nothing about the bookie's ability to list
    assert client.list_capability(bookie) is ListCapability.UNKNOWN


async def test_unknown_operations_get_ebadreq_with_the_header_copied(emu: BookieEmulator) -> None:
    range_read = pb.Request(
        header=pb.BKPacketHeader(
            version=pb.VERSION_THREE, operation=pb.RANGE_READ_ENTRY, txnId=77, priority=100
        )
    )
    batch = pb.Request(
        header=pb.BKPacketHeader(version=pb.VERSION_THREE, operation=pb.BATCH_READ_ENTRY, txnId=78)
    )
    r1, r2 = await raw_exchange(emu, range_read, batch)
    assert Status(r1.status) is Status.EBADREQ and r1.header == range_read.header
    assert Status(r2.status) is Status.EBADREQ and r2.header == batch.header


async def test_wrong_version_auth_and_missing_bodies(emu: BookieEmulator) -> None:
    old = read_entry_request(5, 1, 0)
    old.header.version = pb.VERSION_TWO
    auth = auth_request(6)
    bodiless = pb.Request(
        header=pb.BKPacketHeader(version=pb.VERSION_THREE, operation=pb.READ_LAC, txnId=7)
    )
    r_old, r_auth, r_bodiless = await raw_exchange(emu, old, auth, bodiless)
    assert Status(r_old.status) is Status.EBADVERSION
    assert Status(r_old.readResponse.status) is Status.EBADVERSION
    assert r_old.header.version == pb.VERSION_THREE and r_old.header.txnId == 5
    assert Status(r_auth.status) is Status.EOK and r_auth.header == auth.header
    assert r_auth.authResponse.authPluginName == AUTH_DISABLED_PLUGIN
    assert r_auth.authResponse.payload == b""
    # A bookie reads a missing ReadLacRequest as its defaults: ledger 0, unknown here
    # (tests/interop/test_conformance.py saw a real one do so).
    assert Status(r_bodiless.status) is Status.ENOENTRY


async def test_fencing_read_marks_the_ledger_fenced(
    emu: BookieEmulator, client: BookieClient
) -> None:
    emu.put_ledger(4, range(3), password=b"pw")
    fence = read_entry_request(1, 4, 0)
    fence.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
    no_key = read_entry_request(2, 4, 0)
    no_key.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
    (r_no_key,) = await raw_exchange(emu, no_key)
    assert Status(r_no_key.status) is Status.EUA
    fence.readRequest.masterKey = master_key(b"pw")
    (r_fence,) = await raw_exchange(emu, fence)
    assert Status(r_fence.status) is Status.EOK
    assert await client.add_entry(emu.bookie_id, 4, 3, body(4, 3), password=b"pw") == ErrorStatus(
        Status.EFENCED
    )


async def test_a_garbage_first_frame_closes_the_connection(emu: BookieEmulator) -> None:
    reader, writer = await asyncio.open_connection(*emu.address)
    # a v2 READ frame: not a v3 Request
    writer.write(bytes.fromhex("00000014020200000000000000000005" + "0000000000000000"))
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()
    assert emu.received.total() == 0


# -- multiplexing -------------------------------------------------------------------------------


async def test_out_of_order_responses_reach_their_callers(
    emu: BookieEmulator, client: BookieClient
) -> None:
    bookie = emu.bookie_id
    n = 8
    emu.put_ledger(4, range(n))
    # later requests are answered first
    emu.set_latency(lambda req: 0.03 * (n - req.readRequest.entryId), READ)
    finished: list[int] = []

    async def read(e: int) -> int:
        got = await client.read_entry(bookie, 4, e)
        assert isinstance(got, Ok)
        finished.append(e)
        return got.value.header.entry_id

    assert await asyncio.gather(*(read(e) for e in range(n))) == list(range(n))
    assert finished == list(reversed(range(n)))
    assert emu.connections_accepted == 1


async def test_ten_thousand_requests_in_flight_on_one_connection(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    n = 10_000
    client = clients(max_in_flight=n, request_timeout=30.0)
    bookie = emu.bookie_id
    emu.put_ledger(4, [range(n)])
    emu.pause()
    tasks = [asyncio.ensure_future(client.read_entry(bookie, 4, e)) for e in range(n)]
    await emu.wait_requests(n, READ)
    assert emu.in_flight == n and client.in_flight(bookie) == n
    emu.resume()
    results = await asyncio.gather(*tasks)
    assert [r.value.header.entry_id for r in results if isinstance(r, Ok)] == list(range(n))
    assert emu.max_in_flight == n
    assert emu.connections_accepted == 1 and client.connections_opened(bookie) == 1
    assert client.in_flight(bookie) == 0


async def test_in_flight_cap_is_respected(emu: BookieEmulator, clients: MakeClient) -> None:
    client = clients(max_in_flight=4)
    bookie = emu.bookie_id
    emu.put_ledger(4, range(40))
    emu.set_latency(0.01)
    results = await asyncio.gather(*(client.read_entry(bookie, 4, e) for e in range(40)))
    assert all(r.ok for r in results)
    assert emu.received[READ] == 40
    assert emu.max_in_flight == 4


async def test_request_timeout_and_late_response_dropped(
    emu: BookieEmulator, client: BookieClient
) -> None:
    bookie = emu.bookie_id
    emu.put_ledger(4, range(3))
    assert (await client.read_entry(bookie, 4, 0)).ok  # connect first
    emu.pause()
    t0 = time.monotonic()
    late = await client.read_entry(bookie, 4, 1, request_timeout=0.2)
    elapsed = time.monotonic() - t0
    assert isinstance(late, NoAnswer) and late.reason is Unanswered.TIMEOUT
    assert not late.answered
    assert 0.2 <= elapsed < 0.8
    emu.resume()  # the held request is answered now, after its caller gave up
    again = await client.read_entry(bookie, 4, 2)
    assert isinstance(again, Ok) and again.value.header.entry_id == 2
    assert client.unmatched_responses(bookie) == 1
    assert client.connections_opened(bookie) == 1


# -- bookies that cannot list ------------------------------------------------------------------


async def test_dbledger_bookie_costs_one_timeout_then_cannot_list_at_once(
    emulators: MakeEmulator, clients: MakeClient
) -> None:
    emu = await emulators(storage=Storage.DBLEDGER)
    client = clients(list_timeout=0.3)
    bookie = emu.bookie_id
    for ledger in range(1, 21):
        emu.put_ledger(ledger, range(10))
    # an unknown ledger is answered (ENOLEDGER) and proves nothing about listing
    assert await client.get_list_of_entries(bookie, 999) == ErrorStatus(Status.ENOLEDGER)
    assert client.list_capability(bookie) is ListCapability.UNKNOWN
    emu.reset_stats()

    t0 = time.monotonic()
    results = await asyncio.gather(
        *(client.get_list_of_entries(bookie, ledger) for ledger in range(1, 21))
    )
    elapsed = time.monotonic() - t0
    assert all(isinstance(r, CannotList) for r in results)
    assert not any(r.answered for r in results)
    assert emu.received[LIST] == 1  # one probe, the others waited for its verdict
    assert 0.3 <= elapsed < 0.55  # one timeout, not twenty
    assert client.list_capability(bookie) is ListCapability.CANNOT_LIST

    t0 = time.monotonic()
    again = await client.get_list_of_entries(bookie, 1)
    assert isinstance(again, CannotList) and time.monotonic() - t0 < 0.05
    assert emu.received[LIST] == 1  # not even sent
    assert (await client.read_entry(bookie, 1, 0)).ok  # the bookie itself is fine


async def test_list_capability_verdict_expires(
    emulators: MakeEmulator, clients: MakeClient
) -> None:
    emu = await emulators(storage=Storage.DBLEDGER)
    client = clients(list_timeout=0.2, list_capability_ttl=0.0)
    bookie = emu.bookie_id
    emu.put_ledger(1, range(3))
    assert isinstance(await client.get_list_of_entries(bookie, 1), CannotList)
    # with a zero TTL the verdict is gone at once: the next call probes again
    assert isinstance(await client.get_list_of_entries(bookie, 1), CannotList)
    assert emu.received[LIST] == 2
    client.forget_list_capability(bookie)
    assert client.list_capability(bookie) is ListCapability.UNKNOWN


async def test_sorted_bookie_probe_lets_waiters_through(
    emu: BookieEmulator, client: BookieClient
) -> None:
    bookie = emu.bookie_id
    for ledger in range(1, 11):
        emu.put_ledger(ledger, range(ledger))
    results = await asyncio.gather(
        *(client.get_list_of_entries(bookie, ledger) for ledger in range(1, 11))
    )
    assert [r.value.total for r in results if isinstance(r, Ok)] == list(range(1, 11))
    assert client.list_capability(bookie) is ListCapability.CAN_LIST


async def test_dbledger_without_workers_closes_and_is_learnt(
    emulators: MakeEmulator, clients: MakeClient
) -> None:
    emu = await emulators(storage=Storage.DBLEDGER_NO_WORKERS)
    client = clients()
    bookie = emu.bookie_id
    emu.put_ledger(1, range(3))
    first = await client.get_list_of_entries(bookie, 1)
    assert isinstance(first, NoAnswer) and first.reason is Unanswered.DISCONNECTED
    second = await client.get_list_of_entries(bookie, 1)
    assert isinstance(second, CannotList)
    assert isinstance(await client.get_list_of_entries(bookie, 1), CannotList)
    assert emu.received[LIST] == 2
    assert (await client.read_entry(bookie, 1, 2)).ok  # reconnects for other operations


# -- connections ----------------------------------------------------------------------------


async def test_reconnect_after_crash_and_restart(emu: BookieEmulator, client: BookieClient) -> None:
    bookie = emu.bookie_id
    emu.put_ledger(4, range(3))
    assert (await client.read_entry(bookie, 4, 0)).ok
    emu.pause()
    pending = asyncio.ensure_future(client.read_entry(bookie, 4, 1))
    await emu.wait_requests(2, READ)
    await emu.crash()
    lost = await pending
    assert isinstance(lost, NoAnswer) and lost.reason is Unanswered.DISCONNECTED
    down = await client.read_entry(bookie, 4, 1)
    assert isinstance(down, NoAnswer) and down.reason is Unanswered.UNREACHABLE
    emu.resume()
    await emu.restart()
    assert emu.bookie_id == bookie
    back = await client.read_entry(bookie, 4, 1)
    assert isinstance(back, Ok) and back.value.body == default_body(4, 1)  # same data
    assert client.connections_opened(bookie) == 2


async def test_backoff_fails_fast_after_a_failed_connect(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    client = clients(backoff_initial=30.0)
    bookie = emu.bookie_id
    emu.put_ledger(4, range(3))
    await emu.crash()
    first = await client.read_entry(bookie, 4, 0)
    assert isinstance(first, NoAnswer) and first.reason is Unanswered.UNREACHABLE
    await emu.restart()
    accepted = emu.connections_accepted
    t0 = time.monotonic()
    second = await client.read_entry(bookie, 4, 0)
    assert isinstance(second, NoAnswer) and second.reason is Unanswered.UNREACHABLE
    assert "next attempt" in second.detail and time.monotonic() - t0 < 0.1
    assert emu.connections_accepted == accepted  # did not even try


async def test_unresolvable_bookies(clients: MakeClient) -> None:
    async def nowhere(bookie_id: str) -> tuple[str, int] | None:
        return None

    async def broken(bookie_id: str) -> tuple[str, int] | None:
        raise RuntimeError("zk down")

    async with BookieClient(nowhere) as a, BookieClient(broken) as b:
        for c in (a, b):
            got = await c.read_entry("not-a-host-port", 1, 0)
            assert isinstance(got, NoAnswer) and got.reason is Unanswered.NOT_RESOLVED
    # unregistered and the id is not host:port: the ZooKeeper resolver finds nothing either
    info = await clients().get_bookie_info("some-uuid-bookie")
    assert isinstance(info, NoAnswer) and info.reason is Unanswered.NOT_RESOLVED


async def test_garbage_from_a_bookie_is_a_protocol_error(leak_check: None) -> None:
    handled = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"\x00\x00\x00\x03\xff\xff\xff")  # a frame that is no Response
        await writer.drain()
        await reader.read()  # until the client drops the connection
        writer.close()
        handled.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def here(bookie_id: str) -> tuple[str, int]:
        return "127.0.0.1", port

    async with server, BookieClient(here, request_timeout=2.0) as client:
        got = await client.read_entry("x", 1, 0)
        assert isinstance(got, NoAnswer) and got.reason is Unanswered.PROTOCOL_ERROR
        assert not client.is_connected("x")
        await handled.wait()


async def test_close_fails_pending_and_queued_requests_promptly(
    emu: BookieEmulator, clients: MakeClient
) -> None:
    client = clients(max_in_flight=2, request_timeout=30.0, list_timeout=30.0)
    bookie = emu.bookie_id
    emu.put_ledger(4, range(10))
    emu.pause()
    reads = [asyncio.ensure_future(client.read_entry(bookie, 4, e)) for e in range(5)]
    await emu.wait_requests(2, READ)  # two sent, three queued behind the cap
    lists = [asyncio.ensure_future(client.get_list_of_entries(bookie, 4)) for _ in range(3)]
    await asyncio.sleep(0)
    t0 = time.monotonic()
    await client.close()
    results = await asyncio.gather(*reads, *lists)
    assert time.monotonic() - t0 < 0.5
    assert all(isinstance(r, NoAnswer) and r.reason is Unanswered.CLOSED for r in results)
    assert await client.read_entry(bookie, 4, 0) == NoAnswer(
        Unanswered.CLOSED, "bookie client closed"
    )
    emu.resume()


async def test_raw_list_request_frames_are_v3(emu: BookieEmulator) -> None:
    emu.put_ledger(5, [0, 1, 2])
    (resp,) = await raw_exchange(emu, get_list_of_entries_request(4, 5))
    assert resp.header.txnId == 4 and Status(resp.status) is Status.EOK
    avail = Availability.decode(resp.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger)
    assert list(avail.entries()) == [0, 1, 2]


async def test_run_emulator_serves_until_cancelled(
    zk: ZkClient, zk_hosts: str, clients: MakeClient
) -> None:
    port = free_port()
    bookie = f"127.0.0.1:{port}"
    task = asyncio.create_task(run_emulator(zk_hosts, "127.0.0.1", port, ROOT, "dbledger", False))
    async with asyncio.timeout(20), contextlib.aclosing(watch_bookies(zk, ROOT)) as sets:
        async for bookies in sets:
            if bookie in bookies.writable:
                break
    info = await clients().get_bookie_info(bookie)
    assert isinstance(info, Ok) and info.value.total_disk_capacity is not None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await zk.exists(f"{ROOT}/available/{bookie}") is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["seed", "drop", "add"]), st.integers(0, 60), st.integers(0, 12)),
        max_size=25,
    )
)
def test_emulator_storage_matches_a_set_model(ops: list[tuple[str, int, int]]) -> None:
    """Seeded ranges, single adds and drops, against a plain dict of entry -> body."""
    emu = BookieEmulator(None)
    emu.put_ledger(1)
    model: dict[int, bytes] = {}
    for i, (op, start, length) in enumerate(ops):
        span = range(start, start + length)
        if op == "seed":
            factory = make_body_factory(payload_size=i + 1)
            emu.put_ledger(1, [span] if i % 2 else list(span), body_factory=factory)
            model.update({e: factory(1, e) for e in span})
        elif op == "drop":
            emu.drop_entries(1, [span] if i % 2 else list(span))
            for e in span:
                model.pop(e, None)
        else:
            emu.put_entry(1, start, b"added %d" % i)
            model[start] = b"added %d" % i
    avail = emu.availability(1)
    assert avail is not None and list(avail.entries()) == sorted(model)
    for e in range(80):
        assert emu.has_entry(1, e) == (e in model)
        assert emu.entry_body(1, e) == model.get(e)


def test_protocol_errors_are_typed() -> None:
    with pytest.raises(BookieProtocolError):
        decode_response(b"\xff")
