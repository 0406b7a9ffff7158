"""The auditor's verdicts hinge on one distinction: a bookie that *answered* ("I have no
such ledger") is evidence, a bookie that did not answer is not; no check may take silence
for "missing", so a bookie call's outcome is a value whose type says which it was.

What one call to a bookie came to, as values a check can branch on.

Every client call returns one of a few outcome types instead of raising, so that
"missing" can only ever be concluded from an `Ok` or an `ErrorStatus`, and every
kind of silence (`NoAnswer`, `CannotList`) is visibly something else:

* `Ok(value)`: the bookie answered EOK.
* `ErrorStatus(status)`: the bookie answered with that status (ENOLEDGER,
  ENOENTRY, EUA, ETOOMANYREQUESTS, ...). Note that READ_LAC answers ENOENTRY
  (not ENOLEDGER) for a ledger the bookie does not have.
* `NoAnswer(reason)`: no usable answer (not resolvable, unreachable, timed
  out, connection dropped, garbage, client closed, TLS failed, or refused as
  unauthenticated: an EUA that says nothing about the ledger asked about).
* `CannotList`: only from `get_list_of_entries`: this bookie is known not to
  answer list requests for ledgers it holds (DbLedgerStorage), so nothing can
  be learnt from it this way; it says nothing about missing entries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeAlias, TypeVar

from auditor.bookie.availability import Availability
from auditor.bookie.protocol import EntryHeader, Status, decode_entry_header

__all__ = [
    "BookieInfo",
    "CannotList",
    "EntryRead",
    "ErrorStatus",
    "LacRead",
    "ListCapability",
    "ListOutcome",
    "NoAnswer",
    "Ok",
    "Outcome",
    "RawListOutcome",
    "Unanswered",
]

T = TypeVar("T")


class Unanswered(enum.Enum):
    """Why a call has no answer from the bookie."""

    #: The resolver had no address for the bookie id (or failed).
    NOT_RESOLVED = "not resolved"
    #: The TCP connection could not be made (refused, timed out, or backing off after that).
    UNREACHABLE = "unreachable"
    #: The request was sent and no response came within its timeout.
    TIMEOUT = "timeout"
    #: The connection dropped while the request was pending.
    DISCONNECTED = "disconnected"
    #: The bookie sent something that is not a usable answer; the connection was dropped.
    PROTOCOL_ERROR = "protocol error"
    #: The client was closed.
    CLOSED = "closed"
    #: START_TLS was refused, or the TLS handshake or session failed (a certificate
    #: not trusted or not presented, no common protocol): a setup problem, not silence.
    TLS_FAILED = "tls failed"
    #: The bookie's authentication layer refused the request unread (EUA with no body):
    #: this connection is not authenticated, typically because the bookie requires TLS.
    UNAUTHORIZED = "unauthorized"


class ListCapability(enum.Enum):
    """Whether a bookie answers GET_LIST_OF_ENTRIES_OF_LEDGER for ledgers it holds."""

    UNKNOWN = "unknown"
    CAN_LIST = "can list"
    CANNOT_LIST = "cannot list"


@dataclass(frozen=True, slots=True)
class Ok(Generic[T]):
    value: T
    ok: ClassVar[bool] = True
    answered: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """The bookie answered, with a status other than EOK."""

    status: Status
    ok: ClassVar[bool] = False
    answered: ClassVar[bool] = True

    def __str__(self) -> str:
        return self.status.name


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """The bookie gave no usable answer; nothing is known about what it holds."""

    reason: Unanswered
    detail: str = ""
    ok: ClassVar[bool] = False
    answered: ClassVar[bool] = False

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


@dataclass(frozen=True, slots=True)
class CannotList:
    """The bookie is known not to answer list requests for ledgers it holds (until `until`).

    `until` is on the event loop's clock (`loop.time()`).
    """

    bookie_id: str
    until: float
    ok: ClassVar[bool] = False
    answered: ClassVar[bool] = False

    def __str__(self) -> str:
        return f"{self.bookie_id} cannot list entries (DbLedgerStorage or similar)"


Outcome: TypeAlias = Ok[T] | ErrorStatus | NoAnswer
ListOutcome: TypeAlias = Ok[Availability] | ErrorStatus | NoAnswer | CannotList
#: A list request answered on `BookieClient.start_lists_raw`'s hot path: the availability's
#: wire form, not decoded yet.
RawListOutcome: TypeAlias = Ok[bytes] | ErrorStatus | NoAnswer


@dataclass(frozen=True, slots=True)
class EntryRead:
    """A READ_ENTRY answer. `entry_id` is as echoed (-1 when the last entry was asked for)."""

    ledger_id: int
    entry_id: int
    body: bytes
    #: The bookie's last-add-confirmed for the ledger, when it sent one.
    max_lac: int | None

    @property
    def header(self) -> EntryHeader:
        """The body's header (raises BookieProtocolError if the body is too short)."""
        return decode_entry_header(self.body)


@dataclass(frozen=True, slots=True)
class LacRead:
    """A READ_LAC answer: the explicit LAC blob and/or the ledger's last entry, as stored."""

    ledger_id: int
    lac_body: bytes | None
    last_entry_body: bytes | None

    @property
    def explicit_lac(self) -> int | None:
        """The LAC in the explicit blob (`[ledgerId 8][lac 8][digest]`), if usable."""
        body = self.lac_body
        if body is None or len(body) < 16:
            return None
        return int.from_bytes(body[8:16], "big", signed=True)

    @property
    def last_entry(self) -> EntryHeader | None:
        """The header of the last stored entry, if sent and long enough to hold one."""
        body = self.last_entry_body
        if body is None or len(body) < 32:
            return None
        return decode_entry_header(body)


@dataclass(frozen=True, slots=True)
class BookieInfo:
    """GET_BOOKIE_INFO: only the fields that were requested are set."""

    total_disk_capacity: int | None
    free_disk_space: int | None
