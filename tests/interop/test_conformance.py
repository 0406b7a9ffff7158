"""Conformance: the bookie emulator answers every request as a real BookKeeper bookie does.

The fast tests (tests/unit, tests/integration) run the auditor against `BookieEmulator`
only, so whatever the emulator gets wrong about a bookie, those tests get wrong too, and
stay green. Here the same request sequences go to a real bookie (BookKeeper 4.17.2, each
ledger storage, read-only ones) and to an emulator imitating that storage, over the
product's own v3 code (`BookieConnection`, the protocol module's builders), and the two
`Response` messages must be equal as protobuf messages: header, status, and every field
of the operation's response with its presence, entry bodies and availability bytes to the
byte. Only GET_BOOKIE_INFO's disk figures are machine facts; there presence is compared.
Each test also states the exact outcome, so a test names what a bookie does, not only
that the two agree.

The real bookie is the truth: a difference is fixed in the emulator (or, when the
product misreads a real answer, in the product), never here.

Request kinds compared (ids in the test names):
GET_LIST_OF_ENTRIES_OF_LEDGER (closed, open, never-written, fenced-empty and unknown
ledgers; Sorted, Interleaved and DbLedgerStorage, the last also without read worker
threads), READ_ENTRY (plain, FENCE_LEDGER,
recovery read, wrong master key, missing entry, unknown ledger, LAST_ADD_CONFIRMED),
READ_LAC, WRITE_LAC, ADD_ENTRY and RECOVERY_ADD (right and wrong master key, to a fenced
ledger, to a read-only bookie, high priority or not, an entry added twice, the LAC a read
reports), GET_BOOKIE_INFO (every flag, and none), and what a bookie does with operations
it does not serve, a header version other than three, AUTH, and requests lacking their
operation's message. Last, the product's `BookieClient` must make the same outcomes of
the real answers as of the emulated ones.

A "recovery read" is what the Java client sends for one (v3 has no flag of that name):
FENCE_LEDGER with the master key, under a header of priority 100.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from google.protobuf import text_format

from auditor.bookie.availability import Availability
from auditor.bookie.client import BookieClient
from auditor.bookie.connection import BookieConnection, CallFailed
from auditor.bookie.protocol import (
    LAST_ADD_CONFIRMED,
    Operation,
    Status,
    add_entry_request,
    auth_request,
    encode_entry_body,
    get_bookie_info_request,
    get_list_of_entries_request,
    master_key,
    read_entry_request,
    read_lac_request,
    request_header,
    verify_entry_body,
)
from auditor.bookie.results import CannotList, ErrorStatus, ListCapability, Ok, Unanswered
from auditor.metadata.model import DigestType
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie import BookieEmulator, Storage
from tests.interop.conftest import MakeCluster
from tests.interop.realbk import RealBookie, RealCluster, payload

#: A real bookie on a loaded 2-core machine answers in milliseconds; this only bounds a hang.
ANSWER_TIMEOUT = 10.0
#: How long a DbLedgerStorage bookie's silence is awaited. It never answers (the request
#: dies in its read thread pool), so this is the cost of the one test that proves it.
SILENCE_TIMEOUT = 1.5
CONNECT_TIMEOUT = 5.0
#: The ledger password of every ledger here, the Java client's and the raw ones.
PASSWORD = b"conformance"
KEY = master_key(PASSWORD)
WRONG_KEY = master_key(b"not the password")
#: The header priority the Java client gives recovery reads and adds (FLAG_HIGH_PRIORITY).
HIGH_PRIORITY = 100
#: Entries the Java client writes to its closed and its open ledger.
CLOSED_ENTRIES = 6
OPEN_ENTRIES = 4

#: The emulator mode that imitates each real ledger storage.
EMULATED = {
    "sorted": Storage.SORTED,
    "interleaved": Storage.INTERLEAVED,
    "db": Storage.DBLEDGER,
}
#: Settings of the module's bookies beyond realbk's. SortedLedgerStorage keeps the first
#: copy of an entry added twice only until its memtable is flushed (every
#: `flushInterval`): a minute makes that window cover a whole test, not a lucky moment.
SETTINGS: dict[str, dict[str, object]] = {"sorted": {"flushInterval": 60000}}
STORAGES = list(EMULATED)
READ_ONLY: dict[str, object] = {"readOnlyModeEnabled": "true", "forceReadOnlyBookie": "true"}
#: The module's other bookies, read-only so that the Java client places no ledger on
#: them: (real ledger storage, settings, emulator mode). "db-noworkers" is there for
#: what DbLedgerStorage does to a list request on its I/O thread (no read worker
#: threads), which read-only does not change; it is given its ledger by a high-priority
#: add, which a read-only bookie accepts.
OTHERS: dict[str, tuple[str, dict[str, object], Storage]] = {
    "readonly": ("sorted", READ_ONLY, Storage.SORTED),
    "db-noworkers": ("db", {**READ_ONLY, "numReadWorkerThreads": 0}, Storage.DBLEDGER_NO_WORKERS),
}

_txn = itertools.count(1)
#: Raw ledgers (written from Python) are numbered far above the Java client's ids.
_raw_ledgers = itertools.count(7_000_000)


@dataclass(frozen=True, slots=True)
class World:
    """The module's real cluster: one bookie per ledger storage, one read-only bookie,
    and the Java client's ledgers on the three writable ones."""

    cluster: RealCluster
    bookies: dict[str, RealBookie]
    #: Written by the Java client and closed / left open / closed with no entry.
    closed: int
    open: int
    empty: int


@pytest.fixture(scope="module")
def world(module_cluster_factory: MakeCluster) -> Iterator[World]:
    cluster = module_cluster_factory()
    # The bookie JVMs start in parallel (seconds of mostly waiting each). The read-only
    # one registers as read-only from the start (its state is set before it registers),
    # so the Java client never places a ledger on it. The client starts once all are
    # up: its first read of the registrations then sees every one, and creating a ledger
    # on three bookies cannot race their registration.
    wanted = {s: (s, SETTINGS.get(s, {})) for s in STORAGES}
    wanted.update({name: (storage, settings) for name, (storage, settings, _) in OTHERS.items()})
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        started = {
            name: pool.submit(cluster.add_bookie, storage, **settings)
            for name, (storage, settings) in wanted.items()
        }
        bookies = {name: f.result() for name, f in started.items()}
    shape = {"ensemble": 3, "write": 3, "ack": 3, "password": PASSWORD.decode()}
    closed = cluster.client.ok("create", digest="CRC32C", entries=CLOSED_ENTRIES, **shape)
    opened = cluster.client.ok("create", digest="CRC32", entries=OPEN_ENTRIES, close=False, **shape)
    empty = cluster.client.ok("create", digest="CRC32C", entries=0, **shape)
    writable = {bookies[s].bookie_id for s in STORAGES}
    for answer in (closed, opened, empty):  # one ensemble, never changed: all three
        ensembles = answer["metadata"]["ensembles"]
        assert (list(ensembles), set(ensembles["0"])) == (["0"], writable), answer
    yield World(cluster, bookies, closed["ledger"], opened["ledger"], empty["ledger"])


class Side:
    """One bookie, real or emulated, over one v3 connection of the product's own."""

    def __init__(self, name: str, conn: BookieConnection) -> None:
        self.name = name
        self.conn = conn

    @classmethod
    async def open(cls, name: str, address: tuple[str, int]) -> Side:
        host, port = address
        conn = await BookieConnection.open(
            f"{host}:{port}", host, port, connect_timeout=CONNECT_TIMEOUT
        )
        return cls(name, conn)

    async def ask(self, request: pb.Request, within: float) -> pb.Response | None:
        """The bookie's answer, or None when it sent none within `within` seconds."""
        try:
            return await self.conn.call(request, within)
        except CallFailed as exc:
            if exc.reason is Unanswered.TIMEOUT:
                return None
            raise

    async def close(self) -> None:
        self.conn.close()
        await asyncio.wait_for(self.conn.wait_closed(), CONNECT_TIMEOUT)


def _show(resp: pb.Response | None) -> str:
    return "no answer" if resp is None else text_format.MessageToString(resp, as_one_line=True)


def _figures_blanked(resp: pb.Response | None) -> pb.Response | None:
    """GET_BOOKIE_INFO with its disk figures zeroed: their presence is the protocol, their
    values are the machine's."""
    if resp is None or not resp.HasField("getBookieInfoResponse"):
        return resp
    out = pb.Response()
    out.CopyFrom(resp)
    info = out.getBookieInfoResponse
    for name in ("totalDiskCapacity", "freeDiskSpace"):
        if info.HasField(name):
            setattr(info, name, 0)
    return out


class Pair:
    """A real bookie and an emulator of its ledger storage, asked the same things."""

    def __init__(self, storage: str, real: Side, emu: Side, emulator: BookieEmulator) -> None:
        self.storage = storage
        self.real = real
        self.emu = emu
        self.emulator = emulator

    async def both(
        self, request: pb.Request, within: float = ANSWER_TIMEOUT
    ) -> tuple[pb.Response | None, pb.Response | None]:
        real, emu = await asyncio.gather(
            self.real.ask(request, within), self.emu.ask(request, within)
        )
        return real, emu

    async def same(self, request: pb.Request) -> pb.Response:
        """Asks both; they must answer, and alike. Returns the real bookie's answer."""
        real, emu = await self.both(request)
        if _figures_blanked(real) != _figures_blanked(emu):
            pytest.fail(
                f"{self.storage} bookie and emulator differ on "
                f"{text_format.MessageToString(request, as_one_line=True)}\n"
                f"  real:     {_show(real)}\n  emulator: {_show(emu)}",
                pytrace=False,
            )
        if real is None:
            pytest.fail(f"neither answered {text_format.MessageToString(request)}")
        return real

    async def add(
        self,
        ledger: int,
        entry: int,
        *,
        lac: int | None = None,
        key: bytes = KEY,
        recovery: bool = False,
        priority: int = 0,
        digest: DigestType = DigestType.CRC32C,
    ) -> pb.Response:
        """One ADD_ENTRY of a raw entry (a body as a Java writer makes it) to both."""
        request = add_entry_request(
            next(_txn), ledger, entry, key, raw_body(ledger, entry, lac, digest), recovery=recovery
        )
        if priority:
            request.header.priority = priority
        return await self.same(request)

    async def read(
        self, ledger: int, entry: int, *, fence_key: bytes | None = None, priority: int = 0
    ) -> pb.Response:
        request = read_entry_request(next(_txn), ledger, entry, fence_key=fence_key)
        if priority:
            request.header.priority = priority
        return await self.same(request)


def raw_body(
    ledger: int, entry: int, lac: int | None = None, digest: DigestType = DigestType.CRC32C
) -> bytes:
    """Entry `entry` as a sequential writer sends it: LAC entry - 1, realbk's payload."""
    data = payload(ledger, entry)
    return encode_entry_body(
        ledger,
        entry,
        entry - 1 if lac is None else lac,
        (entry + 1) * len(data),
        data,
        digest,
        PASSWORD,
    )


def status(resp: pb.Response) -> Status:
    return Status(resp.status)


async def _replay(world: World, pair: Pair) -> None:
    """Gives the emulator the Java client's entries as the real bookie holds them, by the
    same ADD_ENTRY a writer sends (read back from the real one: their LACs are the
    client's to choose)."""
    for ledger, count in ((world.closed, CLOSED_ENTRIES), (world.open, OPEN_ENTRIES)):
        for entry in range(count):
            read = await pair.real.ask(
                read_entry_request(next(_txn), ledger, entry), ANSWER_TIMEOUT
            )
            assert read is not None and status(read) is Status.EOK, _show(read)
            add = add_entry_request(next(_txn), ledger, entry, KEY, read.readResponse.body)
            added = await pair.emu.ask(add, ANSWER_TIMEOUT)
            assert added is not None and status(added) is Status.EOK, _show(added)


@pytest.fixture
async def pair(world: World, request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """`request.param` names the real bookie: one of STORAGES or OTHERS."""
    name: str = request.param
    real_bookie = world.bookies[name]
    other = OTHERS.get(name)
    storage = EMULATED[name] if other is None else other[2]
    emulator = BookieEmulator(storage=storage, readonly=other is not None)
    await emulator.start()
    real = await Side.open(name, real_bookie.address)
    emu = await Side.open("emulator", emulator.address)
    the_pair = Pair(name, real, emu, emulator)
    try:
        if other is None:
            await _replay(world, the_pair)
        yield the_pair
    finally:
        await real.close()
        await emu.close()
        await emulator.stop()


writable = pytest.mark.parametrize("pair", STORAGES, indirect=True)
listing = pytest.mark.parametrize("pair", ["sorted", "interleaved"], indirect=True)


def _list(ledger: int) -> pb.Request:
    return get_list_of_entries_request(next(_txn), ledger)


# --- GET_LIST_OF_ENTRIES_OF_LEDGER ---------------------------------------------------------


@listing
async def test_get_list_of_entries_closed_open_empty_fenced_empty_and_unknown_ledgers(
    world: World, pair: Pair
) -> None:
    """Availability bytes, to the byte, for every state a ledger can be in on the bookie.

    A ledger created and closed with no entry was never sent to a bookie, so it is as
    unknown there as a ledger that does not exist; one fenced before any entry reached
    the bookie is held, with nothing in it.
    """
    for ledger, count in ((world.closed, CLOSED_ENTRIES), (world.open, OPEN_ENTRIES)):
        resp = await pair.same(_list(ledger))
        assert status(resp) is Status.EOK
        got = resp.getListOfEntriesOfLedgerResponse
        assert (got.ledgerId, Availability.decode(got.availabilityOfEntriesOfLedger)) == (
            ledger,
            Availability.from_entries(range(count)),
        )
    for ledger in (world.empty, 987_654_321):
        resp = await pair.same(_list(ledger))
        assert status(resp) is Status.ENOLEDGER
        assert not resp.getListOfEntriesOfLedgerResponse.HasField("availabilityOfEntriesOfLedger")
    fenced = next(_raw_ledgers)
    await pair.read(fenced, 0, fence_key=KEY)
    resp = await pair.same(_list(fenced))
    assert status(resp) is Status.EOK
    assert Availability.decode(
        resp.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger
    ) == Availability.from_entries([])


@listing
async def test_get_list_of_entries_with_gaps_written_out_of_order(pair: Pair) -> None:
    """Raw adds out of order and with holes: the sequence groups must match exactly."""
    ledger = next(_raw_ledgers)
    entries = [7, 0, 1, 2, 5, 9, 11, 13, 3]
    for entry in entries:
        assert status(await pair.add(ledger, entry)) is Status.EOK
    resp = await pair.same(_list(ledger))
    assert Availability.decode(
        resp.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger
    ) == Availability.from_entries(sorted(entries))


@pytest.mark.parametrize("pair", ["db"], indirect=True)
async def test_get_list_of_entries_on_db_ledger_storage(world: World, pair: Pair) -> None:
    """DbLedgerStorage cannot list: for a ledger it holds nothing comes back at all, and
    the connection stays up; for one it does not hold it answers like the others."""
    request = _list(world.closed)
    real, emu = await pair.both(request, SILENCE_TIMEOUT)
    assert (real, emu) == (None, None), f"real: {_show(real)}; emulator: {_show(emu)}"
    for ledger in (world.empty, 987_654_321):
        resp = await pair.same(_list(ledger))
        assert status(resp) is Status.ENOLEDGER
    info = await pair.same(get_bookie_info_request(next(_txn), 0))
    assert status(info) is Status.EOK
    # The product's client learns it from the one timeout, beside an answered
    # GET_BOOKIE_INFO, from the real bookie as from the emulated one.
    addresses = {"real": pair.real.conn.peer, "emulator": pair.emu.conn.peer}

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return addresses[bookie_id]

    async with BookieClient(
        resolve, request_timeout=ANSWER_TIMEOUT, list_timeout=SILENCE_TIMEOUT
    ) as client:
        outcomes = await asyncio.gather(
            *(client.get_list_of_entries(side, world.closed) for side in addresses)
        )
        assert [(type(o), getattr(o, "bookie_id", None)) for o in outcomes] == [
            (CannotList, "real"),
            (CannotList, "emulator"),
        ]
        assert [client.list_capability(side) for side in addresses] == [
            ListCapability.CANNOT_LIST
        ] * 2


@pytest.mark.parametrize("pair", ["db-noworkers"], indirect=True)
async def test_get_list_of_entries_on_db_ledger_storage_without_read_workers(
    pair: Pair,
) -> None:
    """With numReadWorkerThreads=0 DbLedgerStorage fails a list request on its I/O thread,
    which closes the connection instead of staying silent; unknown ledgers still get
    ENOLEDGER, answered on that thread."""
    ledger = next(_raw_ledgers)
    assert status(await pair.add(ledger, 0, priority=HIGH_PRIORITY)) is Status.EOK
    resp = await pair.same(_list(987_654_321))
    assert status(resp) is Status.ENOLEDGER
    request = _list(ledger)
    outcomes = await asyncio.gather(
        pair.real.ask(request, ANSWER_TIMEOUT),
        pair.emu.ask(request, ANSWER_TIMEOUT),
        return_exceptions=True,
    )
    assert [getattr(o, "reason", o) for o in outcomes] == [Unanswered.DISCONNECTED] * 2


# --- READ_ENTRY ------------------------------------------------------------------------------


@writable
async def test_read_entry_plain_missing_unknown_and_last_add_confirmed(
    world: World, pair: Pair
) -> None:
    """Plain reads of what the Java client wrote: the body as the client sent it (its
    digest checks with the product's code), the bookie's LAC beside it; ENOENTRY past the
    end, ENOLEDGER for a ledger it never saw, and entry -1 for its last entry."""
    for ledger, count, digest in (
        (world.closed, CLOSED_ENTRIES, DigestType.CRC32C),
        (world.open, OPEN_ENTRIES, DigestType.CRC32),
    ):
        for entry in range(count):
            resp = await pair.read(ledger, entry)
            assert status(resp) is Status.EOK
            got = resp.readResponse
            body = verify_entry_body(got.body, digest, PASSWORD)
            assert (got.ledgerId, got.entryId, body.payload) == (
                ledger,
                entry,
                payload(ledger, entry),
            )
            assert got.maxLAC == count - 2  # the last entry carries its predecessor as LAC
        last = await pair.read(ledger, LAST_ADD_CONFIRMED)
        assert status(last) is Status.EOK
        assert last.readResponse.entryId == LAST_ADD_CONFIRMED
        assert verify_entry_body(last.readResponse.body, digest, PASSWORD).entry_id == count - 1
        missing = await pair.read(ledger, count + 5)
        assert status(missing) is Status.ENOENTRY
        assert not missing.readResponse.HasField("body")
    for ledger in (world.empty, 987_654_321):
        for entry in (0, LAST_ADD_CONFIRMED):
            assert status(await pair.read(ledger, entry)) is Status.ENOLEDGER


@writable
async def test_read_entry_with_a_wrong_master_key_but_no_fence_flag(
    world: World, pair: Pair
) -> None:
    """A plain read carries no key check: a master key without FENCE_LEDGER is ignored."""
    request = read_entry_request(next(_txn), world.closed, 1)
    request.readRequest.masterKey = WRONG_KEY
    resp = await pair.same(request)
    assert status(resp) is Status.EOK


@writable
async def test_read_entry_fence_ledger_then_adds_and_recovery_reads(pair: Pair) -> None:
    """Fencing as ledger recovery does it: a wrong key is refused and fences nothing; the
    right key fences, after which plain adds are refused and recovery adds still land
    (their key still checked); recovery reads (fence + high priority) read on."""
    ledger = next(_raw_ledgers)
    for entry in range(3):
        assert status(await pair.add(ledger, entry)) is Status.EOK
    assert status(await pair.read(ledger, 1, fence_key=WRONG_KEY)) is Status.EUA
    assert status(await pair.add(ledger, 3)) is Status.EOK  # not fenced by the refusal
    fenced = await pair.read(ledger, 3, fence_key=KEY)
    assert status(fenced) is Status.EOK
    assert fenced.readResponse.body == raw_body(ledger, 3)
    assert status(await pair.add(ledger, 4)) is Status.EFENCED
    assert status(await pair.add(ledger, 4, priority=HIGH_PRIORITY)) is Status.EFENCED
    assert status(await pair.add(ledger, 4, recovery=True, key=WRONG_KEY)) is Status.EUA
    assert status(await pair.add(ledger, 4, recovery=True)) is Status.EOK
    recovery_read = await pair.read(ledger, 4, fence_key=KEY, priority=HIGH_PRIORITY)
    assert status(recovery_read) is Status.EOK
    assert recovery_read.readResponse.body == raw_body(ledger, 4)
    beyond = await pair.read(ledger, 5, fence_key=KEY, priority=HIGH_PRIORITY)
    assert status(beyond) is Status.ENOENTRY
    plain = await pair.read(ledger, 4)
    assert (status(plain), plain.readResponse.maxLAC) == (Status.EOK, 3)
    last = await pair.read(ledger, LAST_ADD_CONFIRMED)
    assert last.readResponse.body == raw_body(ledger, 4)


@writable
async def test_read_entry_fence_of_a_ledger_the_bookie_never_saw(pair: Pair) -> None:
    """Fencing an unknown ledger creates it, empty and fenced: recovery of a ledger whose
    writer died before its first entry reached this bookie."""
    ledger = next(_raw_ledgers)
    assert status(await pair.read(ledger, 0, fence_key=KEY)) is Status.ENOENTRY
    assert status(await pair.read(ledger, 0)) is Status.ENOENTRY
    assert status(await pair.read(ledger, LAST_ADD_CONFIRMED)) is Status.ENOENTRY
    assert status(await pair.same(read_lac_request(next(_txn), ledger))) is Status.ENOENTRY
    assert status(await pair.read(ledger, 0, fence_key=WRONG_KEY)) is Status.EUA
    assert status(await pair.add(ledger, 0)) is Status.EFENCED
    assert status(await pair.add(ledger, 0, recovery=True)) is Status.EOK


@writable
async def test_read_entry_fence_without_master_key(pair: Pair) -> None:
    """FENCE_LEDGER with no master key at all: refused as unauthorised."""
    ledger = next(_raw_ledgers)
    assert status(await pair.add(ledger, 0)) is Status.EOK
    request = read_entry_request(next(_txn), ledger, 0)
    request.readRequest.flag = pb.ReadRequest.FENCE_LEDGER
    assert status(await pair.same(request)) is Status.EUA
    assert status(await pair.add(ledger, 1)) is Status.EOK


# --- ADD_ENTRY / RECOVERY_ADD ----------------------------------------------------------------


@writable
async def test_add_entry_master_keys_rewrites_and_the_bookies_lac(pair: Pair) -> None:
    """The first add sets a ledger's key; a later add with another key is refused, plain
    or recovery (EUA). An entry added twice: SortedLedgerStorage keeps the first copy (in
    its memtable), the others the second. The LAC a read reports: Sorted and Interleaved
    keep the highest any add carried; DbLedgerStorage looks it up in the last entry at
    the first read and follows the adds only from then on."""
    ledger = next(_raw_ledgers)
    assert status(await pair.add(ledger, 0)) is Status.EOK
    assert status(await pair.add(ledger, 1, key=WRONG_KEY)) is Status.EUA
    assert status(await pair.add(ledger, 1, key=WRONG_KEY, recovery=True)) is Status.EUA
    assert status(await pair.add(ledger, 1, recovery=True)) is Status.EOK
    assert status(await pair.add(ledger, 2, lac=1)) is Status.EOK
    assert status(await pair.add(ledger, 2, lac=0)) is Status.EOK  # the same entry again
    read = await pair.read(ledger, 2)
    kept, lac = {"sorted": (1, 1), "interleaved": (0, 1), "db": (0, 0)}[pair.storage]
    assert (read.readResponse.body, read.readResponse.maxLAC) == (
        raw_body(ledger, 2, lac=kept),
        lac,
    )
    # Below the last entry, a higher LAC than the last entry's: the highest counts.
    assert status(await pair.add(ledger, 6, lac=2)) is Status.EOK
    assert status(await pair.add(ledger, 4, lac=3)) is Status.EOK
    read = await pair.read(ledger, 0)
    assert read.readResponse.maxLAC == 3
    added = await pair.add(ledger, 7)
    assert (added.addResponse.ledgerId, added.addResponse.entryId) == (ledger, 7)


@writable
async def test_add_entry_before_and_after_the_first_lac_lookup(pair: Pair) -> None:
    """Where DbLedgerStorage parts from the others: adds before the LAC was first looked
    up do not count, so a high LAC in an entry below the last one is forgotten there."""
    ledger = next(_raw_ledgers)
    for entry, lac in ((0, -1), (1, 5), (2, 1)):
        assert status(await pair.add(ledger, entry, lac=lac)) is Status.EOK
    read = await pair.read(ledger, 0)
    assert read.readResponse.maxLAC == (1 if pair.storage == "db" else 5)
    assert status(await pair.add(ledger, 3, lac=4)) is Status.EOK
    read = await pair.read(ledger, 0)
    assert read.readResponse.maxLAC == (4 if pair.storage == "db" else 5)


async def test_emulator_flush_lets_a_sorted_rewrite_replace() -> None:
    """SortedLedgerStorage's first-copy rule lasts until its memtable is flushed; the
    emulator's `flush` is that moment (emulator only: the real flush is a timer)."""
    async with BookieEmulator(storage=Storage.SORTED) as emulator:
        side = await Side.open("emulator", emulator.address)
        ledger = next(_raw_ledgers)

        async def add(lac: int) -> None:
            request = add_entry_request(next(_txn), ledger, 0, KEY, raw_body(ledger, 0, lac))
            resp = await side.ask(request, ANSWER_TIMEOUT)
            assert resp is not None and status(resp) is Status.EOK

        try:
            await add(-1)
            await add(7)
            assert emulator.entry_body(ledger, 0) == raw_body(ledger, 0, -1)
            emulator.flush()
            await add(3)
            assert emulator.entry_body(ledger, 0) == raw_body(ledger, 0, 3)
        finally:
            await side.close()


# --- READ_LAC and WRITE_LAC ------------------------------------------------------------------


def _write_lac(ledger: int, lac: int, key: bytes = KEY) -> pb.Request:
    """WRITE_LAC as the Java client sends it: the blob is [ledger][lac][digest]."""
    blob = ledger.to_bytes(8, "big") + lac.to_bytes(8, "big", signed=True)
    blob += b"\0" * 4  # a CRC32C-sized digest; the bookie stores the blob as given
    return pb.Request(
        header=request_header(Operation.WRITE_LAC, next(_txn)),
        writeLacRequest=pb.WriteLacRequest(ledgerId=ledger, lac=lac, masterKey=key, body=blob),
    )


@writable
async def test_read_lac_and_write_lac(world: World, pair: Pair) -> None:
    """READ_LAC gives the last entry (and the explicit LAC blob once one was written);
    a ledger the bookie never saw is ENOENTRY, not ENOLEDGER."""
    for ledger, count in ((world.closed, CLOSED_ENTRIES), (world.open, OPEN_ENTRIES)):
        resp = await pair.same(read_lac_request(next(_txn), ledger))
        assert status(resp) is Status.EOK
        got = resp.readLacResponse
        assert not got.HasField("lacBody")
        assert got.lastEntryBody == (await pair.read(ledger, count - 1)).readResponse.body
    for ledger in (world.empty, 987_654_321):
        resp = await pair.same(read_lac_request(next(_txn), ledger))
        assert status(resp) is Status.ENOENTRY
    ledger = next(_raw_ledgers)
    for entry in range(2):
        await pair.add(ledger, entry)
    assert status(await pair.same(_write_lac(ledger, 1, WRONG_KEY))) is Status.EUA
    assert status(await pair.same(_write_lac(ledger, 1))) is Status.EOK
    resp = await pair.same(read_lac_request(next(_txn), ledger))
    assert status(resp) is Status.EOK
    assert resp.readLacResponse.lacBody[8:16] == (1).to_bytes(8, "big")
    assert resp.readLacResponse.lastEntryBody == raw_body(ledger, 1)
    # An explicit LAC for a ledger with no entry: the blob comes back under EIO (the
    # bookie failed to read a last entry), and the product's client, like Java's, takes
    # the status and drops the blob.
    bare = next(_raw_ledgers)
    assert status(await pair.same(_write_lac(bare, 0))) is Status.EOK
    resp = await pair.same(read_lac_request(next(_txn), bare))
    assert status(resp) is Status.EIO
    assert resp.readLacResponse.lacBody[:8] == bare.to_bytes(8, "big")
    assert not resp.readLacResponse.HasField("lastEntryBody")


# --- a read-only bookie ----------------------------------------------------------------------


@pytest.mark.parametrize("pair", ["readonly"], indirect=True)
async def test_add_entry_to_a_read_only_bookie(pair: Pair) -> None:
    """A read-only bookie refuses adds and explicit LACs, recovery adds included, unless
    they come with high priority (as the Java client's recovery and re-replication send
    them); what it holds it still serves."""
    ledger = next(_raw_ledgers)
    assert status(await pair.add(ledger, 0)) is Status.EREADONLY
    assert status(await pair.add(ledger, 0, recovery=True)) is Status.EREADONLY
    assert status(await pair.same(_write_lac(ledger, 0))) is Status.EREADONLY
    assert status(await pair.add(ledger, 0, priority=HIGH_PRIORITY)) is Status.EOK
    flagged = await pair.add(ledger, 1, recovery=True, priority=HIGH_PRIORITY)
    assert status(flagged) is Status.EOK
    read = await pair.read(ledger, 1)
    assert read.readResponse.body == raw_body(ledger, 1)
    assert status(await pair.same(_list(ledger))) is Status.EOK
    info = await pair.same(get_bookie_info_request(next(_txn), 3))
    assert status(info) is Status.EOK


@pytest.mark.parametrize("pair", ["readonly"], indirect=True)
async def test_fencing_and_recovery_reads_on_a_read_only_bookie(pair: Pair) -> None:
    """Ledger recovery on a read-only member of the last ensemble: the fencing read of the
    last entry (no priority, as Java's ReadLastConfirmedOp sends it) and the recovery reads
    after it (priority 100, as PendingReadOp) fence and read whatever the priority, for a
    ledger the bookie holds and for one it never saw (which the fence creates). Only the
    re-adds that follow depend on the priority: without it, EREADONLY."""
    held = next(_raw_ledgers)
    for entry in range(3):
        assert status(await pair.add(held, entry, priority=HIGH_PRIORITY)) is Status.EOK
    for priority in (0, HIGH_PRIORITY):
        fenced = await pair.read(held, LAST_ADD_CONFIRMED, fence_key=KEY, priority=priority)
        assert (status(fenced), fenced.readResponse.body) == (Status.EOK, raw_body(held, 2))
        read = await pair.read(held, 1, fence_key=KEY, priority=priority)
        assert (status(read), read.readResponse.body) == (Status.EOK, raw_body(held, 1))
        beyond = await pair.read(held, 3, fence_key=KEY, priority=priority)
        assert status(beyond) is Status.ENOENTRY
    assert status(await pair.read(held, 1, fence_key=WRONG_KEY)) is Status.EUA
    assert status(await pair.add(held, 3, recovery=True)) is Status.EREADONLY
    assert status(await pair.add(held, 3, priority=HIGH_PRIORITY)) is Status.EFENCED
    readded = await pair.add(held, 3, recovery=True, priority=HIGH_PRIORITY)
    assert status(readded) is Status.EOK
    for priority in (0, HIGH_PRIORITY):
        unseen = next(_raw_ledgers)
        fence = await pair.read(unseen, LAST_ADD_CONFIRMED, fence_key=KEY, priority=priority)
        assert status(fence) is Status.ENOENTRY
        assert status(await pair.add(unseen, 0, priority=HIGH_PRIORITY)) is Status.EFENCED
        added = await pair.add(unseen, 0, recovery=True, priority=HIGH_PRIORITY)
        assert status(added) is Status.EOK


# --- GET_BOOKIE_INFO -------------------------------------------------------------------------


@writable
@pytest.mark.parametrize(
    "requested", [None, 0, 1, 2, 3, 4], ids=lambda r: "unset" if r is None else f"requested={r}"
)
async def test_get_bookie_info_fields_per_requested_flag(pair: Pair, requested: int | None) -> None:
    """Only the requested figures come back (4 is no flag the bookie knows, and a request
    without `requested` asks for nothing: none)."""
    request = get_bookie_info_request(next(_txn), requested or 0)
    if requested is None:
        request.getBookieInfoRequest.ClearField("requested")
    resp = await pair.same(request)
    assert status(resp) is Status.EOK
    info = resp.getBookieInfoResponse
    requested = requested or 0
    assert (info.HasField("totalDiskCapacity"), info.HasField("freeDiskSpace")) == (
        bool(requested & 1),
        bool(requested & 2),
    )
    if requested & 1:
        assert info.totalDiskCapacity > 0
    if requested & 2:
        assert info.freeDiskSpace > 0


# --- requests a bookie does not serve as asked -----------------------------------------------


def _bare(operation: Operation, version: int = pb.VERSION_THREE) -> pb.Request:
    """A request that is its header alone (every field of it set, priority included)."""
    header = request_header(operation, next(_txn))
    header.version = pb.ProtocolVersion.ValueType(version)
    header.priority = HIGH_PRIORITY
    return pb.Request(header=header)


@writable
async def test_unsupported_operations_old_versions_auth_and_bodiless_requests(
    world: World, pair: Pair
) -> None:
    """Operations the v3 dispatcher has no case for get EBADREQ under the request's own
    header; a processor meeting a version other than three says EBADVERSION; AUTH to a
    bookie without authentication is accepted; a request whose operation's message is
    missing is served with that message's defaults (ledger 0, entry 0), as protobuf-java
    hands a processor an absent message."""
    for op in (Operation.RANGE_READ_ENTRY, Operation.RANGE_ADD_ENTRY, Operation.BATCH_READ_ENTRY):
        request = _bare(op)
        resp = await pair.same(request)
        assert (status(resp), resp.header) == (Status.EBADREQ, request.header)
    old = read_entry_request(next(_txn), world.closed, 0)
    old.header.version = pb.VERSION_TWO
    resp = await pair.same(old)
    assert (status(resp), Status(resp.readResponse.status)) == (Status.EBADVERSION,) * 2
    auth = auth_request(next(_txn))
    resp = await pair.same(auth)
    assert (status(resp), resp.authResponse.authPluginName) == (Status.EOK, "AuthDisabledPlugin")
    assert world.closed == 0, "the bodiless requests below read ledger 0"
    for op in (Operation.READ_ENTRY, Operation.READ_LAC, Operation.GET_LIST_OF_ENTRIES_OF_LEDGER):
        if op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER and pair.storage == "db":
            continue
        resp = await pair.same(_bare(op))
        assert status(resp) is Status.EOK
    resp = await pair.same(_bare(Operation.GET_BOOKIE_INFO))
    info = resp.getBookieInfoResponse
    assert (status(resp), info.HasField("totalDiskCapacity"), info.HasField("freeDiskSpace")) == (
        Status.EOK,
        False,
        False,
    )
    resp = await pair.same(_bare(Operation.ADD_ENTRY))  # an empty body: no entry to store
    assert (status(resp), resp.addResponse.ledgerId) == (Status.EBADREQ, 0)


# --- the product's client reads the real answers as the emulated ones ------------------------


@writable
async def test_bookie_client_outcomes(world: World, pair: Pair) -> None:
    """The product's `BookieClient` makes the same outcomes of the real bookie's answers
    as of the emulator's: the values the checks and the worker act on."""
    addresses = {"real": pair.real.conn.peer, "emulator": pair.emu.conn.peer}

    async def resolve(bookie_id: str) -> tuple[str, int] | None:
        return addresses[bookie_id]

    ledger = next(_raw_ledgers)
    outcomes: dict[str, list[object]] = {}
    async with BookieClient(resolve, request_timeout=ANSWER_TIMEOUT) as client:
        for side in addresses:
            body0, body1 = raw_body(ledger, 0), raw_body(ledger, 1)
            outcomes[side] = [
                await client.add_entry(side, ledger, 0, body0, password=PASSWORD),
                await client.read_entry(side, world.closed, 2),
                await client.read_entry(side, world.closed, LAST_ADD_CONFIRMED),
                await client.read_entry(side, world.closed, 99),
                await client.read_entry(side, 987_654_321, 0),
                await client.read_entry(side, ledger, 0, fence=True, password=PASSWORD),
                await client.add_entry(side, ledger, 1, body1, password=PASSWORD),
                await client.add_entry(side, ledger, 1, body1, password=PASSWORD, recovery=True),
                await client.read_lac(side, world.open),
                await client.read_lac(side, 987_654_321),
                await client.get_list_of_entries(side, 987_654_321),
            ]
            if pair.storage != "db":
                outcomes[side].append(await client.get_list_of_entries(side, world.closed))
            info = await client.get_bookie_info(side, 2)
            assert isinstance(info, Ok)
            free = info.value.free_disk_space
            outcomes[side].append((info.value.total_disk_capacity, free is not None and free > 0))
    assert outcomes["real"] == outcomes["emulator"]
    real = outcomes["real"]
    assert real[0] == Ok(0)
    assert [r.status for r in real[3:5] if isinstance(r, ErrorStatus)] == [
        Status.ENOENTRY,
        Status.ENOLEDGER,
    ]
    fenced = real[5]
    assert isinstance(fenced, Ok) and fenced.value.max_lac is None
    assert real[6:8] == [ErrorStatus(Status.EFENCED), Ok(1)]
    assert real[-1] == (None, True)
