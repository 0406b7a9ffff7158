"""The plain marks' fast decode (`decode_plain_mark`, issue #30 item 6) gives what the
general TextFormat parser gives, for every input it takes; every other input is left to
the parser (None), so nothing the parser rejects or reads otherwise is decoded here."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.metadata.records import (
    UNASSIGNED_CTIME,
    RecordFormatError,
    UnderreplicatedLedgerRecord,
    decode_underreplicated_ledger,
    encode_underreplicated_ledger,
)
from auditor.metadata.underreplication import UnderreplicatedLedger, decode_plain_mark


def _general(data: bytes) -> UnderreplicatedLedger | None:
    try:
        rec = decode_underreplicated_ledger(data)
    except RecordFormatError:
        return None
    return UnderreplicatedLedger(7, rec.replicas, rec.ctime_or_unassigned, 3)


def test_what_bookkeeper_writes_is_decoded_fast() -> None:
    data = b'replica: "10.0.0.1:3181"\nreplica: "bk-2.example:3181"\nctime: 1700000000000\n'
    assert decode_plain_mark(7, data, 3) == UnderreplicatedLedger(
        7, ("10.0.0.1:3181", "bk-2.example:3181"), 1700000000000, 3
    )
    assert decode_plain_mark(7, b'replica: "a:1"\n', 0) == UnderreplicatedLedger(
        7, ("a:1",), UNASSIGNED_CTIME, 0
    )
    assert decode_plain_mark(7, b"", 0) == UnderreplicatedLedger(7, (), UNASSIGNED_CTIME, 0)


def test_anything_else_is_left_to_the_parser() -> None:
    for data in (
        b'ctime: 1\nreplica: "a:1"\n',  # another order
        b'replica: "a:1"\nctime: 010\n',  # octal to TextFormat
        b'replica: "a:1"\nctime: 9223372036854775808\n',  # beyond int64
        b'replica: "a\\"b"\n',  # an escape
        b'replica: "a:1" \n',  # other spacing
        b'replica: "a:1"',  # no end of line
        b'replica: "\xc3\xa9"\n',  # not ASCII
        b"this is not { a mark",
    ):
        assert decode_plain_mark(7, data, 3) is None, data


_ids = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
_ctimes = st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=400, deadline=None)
@given(st.lists(_ids, max_size=4), _ctimes)
def test_the_fast_decode_agrees_with_the_parser_on_encoded_marks(
    replicas: list[str], ctime: int | None
) -> None:
    data = encode_underreplicated_ledger(UnderreplicatedLedgerRecord(tuple(replicas), ctime))
    fast = decode_plain_mark(7, data, 3)
    general = _general(data)
    assert general is not None
    assert fast is None or fast == general
    if not any(c in r for r in replicas for c in "\"'\\"):
        assert fast == general  # every plain mark (the encoder escapes none) is decoded fast


@settings(max_examples=400, deadline=None)
@given(
    st.binary(max_size=60) | st.from_regex(rb'(replica: "[ -~]{0,6}"\n|ctime: -?[0-9]{1,20}\n)*')
)
def test_the_fast_decode_never_disagrees_with_the_parser(data: bytes) -> None:
    fast = decode_plain_mark(7, data, 3)
    if fast is not None:
        assert fast == _general(data)
