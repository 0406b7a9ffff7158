"""A client is judged by how it reads a bookie's answers, so the emulator's answers must copy
a bookie's shapes exactly, quirks included.

Answers worded as a bookie words them: which header, which sub-message, which ids echoed.

EBADREQ and AUTH answers carry the request's own header, every other answer a fresh response
header and the operation's sub-message echoing the ids the request named.
"""

from __future__ import annotations

from auditor.bookie.protocol import Operation, Status, response_header
from auditor.proto import bookkeeper_protocol_pb2 as pb

__all__ = ["copied_header_reply", "operation", "status_reply"]


def operation(value: int) -> Operation:
    # Request parsing guarantees a known OperationType (unknown enum values fail it).
    return Operation(value)


def copied_header_reply(request: pb.Request, status: Status) -> pb.Response:
    """An answer carrying the request's own header (EBADREQ, AUTH), as the bookie sends it."""
    reply = pb.Response(status=pb.StatusCode.ValueType(int(status)))
    reply.header.CopyFrom(request.header)
    return reply


def status_reply(request: pb.Request, op: Operation, status: Status) -> pb.Response:
    """The standard answer for `op` with `status`, echoing the ids the request named."""
    code = pb.StatusCode.ValueType(int(status))
    reply = pb.Response(header=response_header(op, request.header.txnId), status=code)
    if op is Operation.READ_ENTRY:
        rr = request.readRequest
        reply.readResponse.CopyFrom(
            pb.ReadResponse(status=code, ledgerId=rr.ledgerId, entryId=rr.entryId)
        )
    elif op is Operation.ADD_ENTRY:
        ar = request.addRequest
        reply.addResponse.CopyFrom(
            pb.AddResponse(status=code, ledgerId=ar.ledgerId, entryId=ar.entryId)
        )
    elif op is Operation.READ_LAC:
        reply.readLacResponse.CopyFrom(
            pb.ReadLacResponse(status=code, ledgerId=request.readLacRequest.ledgerId)
        )
    elif op is Operation.GET_BOOKIE_INFO:
        reply.getBookieInfoResponse.CopyFrom(pb.GetBookieInfoResponse(status=code))
    elif op is Operation.GET_LIST_OF_ENTRIES_OF_LEDGER:
        reply.getListOfEntriesOfLedgerResponse.CopyFrom(
            pb.GetListOfEntriesOfLedgerResponse(
                status=code, ledgerId=request.getListOfEntriesOfLedgerRequest.ledgerId
            )
        )
    elif op is Operation.WRITE_LAC:
        reply.writeLacResponse.CopyFrom(
            pb.WriteLacResponse(status=code, ledgerId=request.writeLacRequest.ledgerId)
        )
    elif op is Operation.FORCE_LEDGER:
        reply.forceLedgerResponse.CopyFrom(
            pb.ForceLedgerResponse(status=code, ledgerId=request.forceLedgerRequest.ledgerId)
        )
    else:
        reply.header.CopyFrom(request.header)
    return reply
