"""What a bookie does for each request is what the conformance tests hold against a real
bookie, and it should read apart from how the emulator receives, delays and holds requests
(`emulator.py`).

What each operation does to the emulated storage, and what it answers.

One function per handled operation, each given the ledgers and the bits of
the bookie's state it reads (read-only, the storage kind, disk figures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from auditor.bookie.protocol import (
    ENTRY_HEADER_SIZE,
    LAST_ADD_CONFIRMED,
    BookieInfoFlag,
    Operation,
    Status,
    decode_entry_header,
)
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.bookie.replies import status_reply
from auditor.testing.bookie.storage import (
    DB_STORAGES,
    Ledger,
    Storage,
    bookie_lac,
    note_added,
)

__all__ = [
    "HANDLED",
    "REQUEST_FIELD",
    "SERVED_WITHOUT_MESSAGE",
    "add_entry",
    "bookie_info",
    "list_entries",
    "read_entry",
    "read_lac",
    "write_lac",
]

#: The emulated bookie's ledgers by id.
Ledgers = dict[int, Ledger]

HANDLED: Final = frozenset(
    {
        Operation.READ_ENTRY,
        Operation.ADD_ENTRY,
        Operation.AUTH,
        Operation.WRITE_LAC,
        Operation.READ_LAC,
        Operation.GET_BOOKIE_INFO,
        Operation.FORCE_LEDGER,
        Operation.GET_LIST_OF_ENTRIES_OF_LEDGER,
    }
)
#: Operations a bookie serves even when their Request lacks the operation's message: the
#: Java processors read an absent message as its defaults (ledger 0, entry 0, no flags),
#: so the emulator does too (seen on a real 4.17.2 bookie). Others still get EBADREQ.
SERVED_WITHOUT_MESSAGE: Final = frozenset(
    {
        Operation.READ_ENTRY,
        Operation.ADD_ENTRY,
        Operation.READ_LAC,
        Operation.GET_BOOKIE_INFO,
        Operation.GET_LIST_OF_ENTRIES_OF_LEDGER,
    }
)
#: The sub-message each handled operation needs in its Request.
REQUEST_FIELD: Final = {
    Operation.READ_ENTRY: "readRequest",
    Operation.ADD_ENTRY: "addRequest",
    Operation.AUTH: "authRequest",
    Operation.WRITE_LAC: "writeLacRequest",
    Operation.READ_LAC: "readLacRequest",
    Operation.GET_BOOKIE_INFO: "getBookieInfoRequest",
    Operation.FORCE_LEDGER: "forceLedgerRequest",
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: "getListOfEntriesOfLedgerRequest",
}


def read_entry(ledgers: Ledgers, request: pb.Request) -> pb.Response:
    rr = request.readRequest
    ledger = ledgers.get(rr.ledgerId)
    if rr.HasField("flag") and rr.flag == pb.ReadRequest.FENCE_LEDGER:
        if not rr.HasField("masterKey"):
            return status_reply(request, Operation.READ_ENTRY, Status.EUA)
        if ledger is None:
            ledger = ledgers[rr.ledgerId] = Ledger(bytes(rr.masterKey))
        elif ledger.master_key is not None and ledger.master_key != rr.masterKey:
            return status_reply(request, Operation.READ_ENTRY, Status.EUA)
        ledger.fenced = True
        fencing = True
    else:
        fencing = False
    if ledger is None:
        return status_reply(request, Operation.READ_ENTRY, Status.ENOLEDGER)
    entry: int | None = rr.entryId
    if entry == LAST_ADD_CONFIRMED:
        entry = ledger.last_entry()
    body = None if entry is None else ledger.body(rr.ledgerId, entry)
    if body is None:
        return status_reply(request, Operation.READ_ENTRY, Status.ENOENTRY)
    reply = status_reply(request, Operation.READ_ENTRY, Status.EOK)
    reply.readResponse.body = body
    if not fencing:  # a fencing read's answer carries the body alone
        reply.readResponse.maxLAC = bookie_lac(ledger, rr.ledgerId)
    return reply


def add_entry(
    ledgers: Ledgers, request: pb.Request, *, readonly: bool, storage: Storage = Storage.SORTED
) -> pb.Response:
    ar = request.addRequest
    op = Operation.ADD_ENTRY
    if readonly and request.header.priority == 0:
        return status_reply(request, op, Status.EREADONLY)
    if ar.ledgerId < 0 or ar.entryId < 0 or len(ar.body) < ENTRY_HEADER_SIZE:
        return status_reply(request, op, Status.EBADREQ)
    head = decode_entry_header(ar.body)
    if (head.ledger_id, head.entry_id) != (ar.ledgerId, ar.entryId):
        return status_reply(request, op, Status.EBADREQ)
    ledger = ledgers.get(ar.ledgerId)
    if ledger is None:
        ledger = ledgers[ar.ledgerId] = Ledger(bytes(ar.masterKey))
    elif ledger.master_key is None:
        ledger.master_key = bytes(ar.masterKey)
    elif ledger.master_key != ar.masterKey:
        return status_reply(request, op, Status.EUA)
    recovery = ar.HasField("flag") and ar.flag == pb.AddRequest.RECOVERY_ADD
    if ledger.fenced and not recovery:
        return status_reply(request, op, Status.EFENCED)
    note_added(ledger, ar.ledgerId, ar.entryId, bytes(ar.body), storage)
    return status_reply(request, op, Status.EOK)


def read_lac(
    ledgers: Ledgers, request: pb.Request, storage: Storage = Storage.SORTED
) -> pb.Response:
    ledger_id = request.readLacRequest.ledgerId
    ledger = ledgers.get(ledger_id)
    lac_body = last_body = None
    if ledger is not None:
        if storage in DB_STORAGES:
            ledger.lac_tracked = True  # looking for an explicit LAC makes its ledger info
        lac_body = ledger.lac_body
        last = ledger.last_entry()
        last_body = None if last is None else ledger.body(ledger_id, last)
    if lac_body is None and last_body is None:
        # The bookie's quirk: with neither blob the status becomes ENOENTRY, even for a
        # ledger it has never heard of.
        return status_reply(request, Operation.READ_LAC, Status.ENOENTRY)
    # An explicit LAC beside no entry: the failed read of the last entry (an I/O error
    # to the bookie) sets the status, and the blob still goes out.
    status = Status.EIO if last_body is None else Status.EOK
    reply = status_reply(request, Operation.READ_LAC, status)
    if lac_body is not None:
        reply.readLacResponse.lacBody = lac_body
    if last_body is not None:
        reply.readLacResponse.lastEntryBody = last_body
    return reply


def bookie_info(
    request: pb.Request, *, total_disk_capacity: int, free_disk_space: int
) -> pb.Response:
    requested = request.getBookieInfoRequest.requested
    reply = status_reply(request, Operation.GET_BOOKIE_INFO, Status.EOK)
    if requested & BookieInfoFlag.TOTAL_DISK_CAPACITY:
        reply.getBookieInfoResponse.totalDiskCapacity = total_disk_capacity
    if requested & BookieInfoFlag.FREE_DISK_SPACE:
        reply.getBookieInfoResponse.freeDiskSpace = free_disk_space
    return reply


def list_entries(
    ledgers: Ledgers, request: pb.Request, storage: Storage, abort: Callable[[], None]
) -> pb.Response | None:
    """The availability of a held ledger, or what DbLedgerStorage does instead (`abort`)."""
    ledger = ledgers.get(request.getListOfEntriesOfLedgerRequest.ledgerId)
    op = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
    if ledger is None:
        return status_reply(request, op, Status.ENOLEDGER)
    if storage is Storage.DBLEDGER:
        return None  # UnsupportedOperationException dies in the read thread pool
    if storage is Storage.DBLEDGER_NO_WORKERS:
        abort()  # ... or, on the I/O thread, closes the connection
        return None
    reply = status_reply(request, op, Status.EOK)
    reply.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger = (
        ledger.availability().encode()
    )
    return reply


def write_lac(
    ledgers: Ledgers, request: pb.Request, *, readonly: bool, storage: Storage = Storage.SORTED
) -> pb.Response:
    wr = request.writeLacRequest
    op = Operation.WRITE_LAC
    if readonly:
        return status_reply(request, op, Status.EREADONLY)
    ledger = ledgers.get(wr.ledgerId)
    if ledger is None:
        ledger = ledgers[wr.ledgerId] = Ledger(bytes(wr.masterKey))
    elif ledger.master_key is not None and ledger.master_key != wr.masterKey:
        return status_reply(request, op, Status.EUA)
    ledger.lac_body = bytes(wr.body)
    if storage in DB_STORAGES:
        ledger.lac_tracked = True  # as READ_LAC: the ledger info exists from now on
    return status_reply(request, op, Status.EOK)
