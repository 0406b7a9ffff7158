"""What counts as a usable `lostBookieRecoveryDelay`, how a bad value is shown, and which
API tokens a client can send: the pure parts of containing bad input."""

from __future__ import annotations

import pytest

from auditor.daemon.contained import MAX_DELAY, SHOWN, parse_delay, shown
from auditor.daemon.state import DaemonState
from auditor.errors import ConfigError
from auditor.secretfiles import check_api_token, token_problem


@pytest.mark.parametrize(
    ("data", "seconds"),
    [
        (b"0", 0),
        (b"30", 30),
        (b"+30", 30),  # Integer.parseInt takes a sign
        (b" 30\n", 30),  # surrounding blanks were always forgiven here
        (b"007", 7),
        (str(MAX_DELAY).encode(), 2_147_483_647),
    ],
)
def test_usable_delays(data: bytes, seconds: int) -> None:
    assert parse_delay(data) == seconds


@pytest.mark.parametrize(
    "data",
    [
        b"abc",
        b"",
        b"   ",
        b"-1",  # a negative delay means nothing
        str(MAX_DELAY + 1).encode(),  # Integer.parseInt refuses it
        b"99999999999999999999999",
        b"1_0",  # Python's int() would take it, Java's would not
        b"1.5",
        b"3 0",
        b"0x10",
        "٣".encode(),  # a digit, but not ASCII
        b"\xff\xfe",
        b"--1",
    ],
)
def test_bad_delays(data: bytes) -> None:
    assert parse_delay(data) is None


def test_a_bad_value_is_shown_bounded_and_printable() -> None:
    assert shown(b"abc") == "b'abc'"
    assert shown(b"\x00\xff") == "b'\\x00\\xff'"
    big = b"x" * 50_000_000
    text = shown(big)
    assert text == f"{b'x' * SHOWN!r}... (50000000 bytes)"


def test_invalid_znodes_are_news_once_per_value() -> None:
    state = DaemonState("a:1")
    assert state.znode_invalid("lostBookieRecoveryDelay", "b'abc'", "the configured 5 s", 1.0)
    assert not state.znode_invalid("lostBookieRecoveryDelay", "b'abc'", "the configured 5 s", 2.0)
    # A new fallback (configuration reloaded) is kept, but the value is not news.
    assert not state.znode_invalid("lostBookieRecoveryDelay", "b'abc'", "the configured 9 s", 3.0)
    bad = state.invalid_znodes["lostBookieRecoveryDelay"]
    assert (bad.using, bad.since) == ("the configured 9 s", 1.0)
    assert state.znode_invalid("lostBookieRecoveryDelay", "b'-1'", "the configured 9 s", 4.0)
    assert state.invalid_znodes["lostBookieRecoveryDelay"].since == 4.0
    assert state.znode_valid("lostBookieRecoveryDelay")
    assert not state.znode_valid("lostBookieRecoveryDelay")
    assert state.znode_invalid("lostBookieRecoveryDelay", "b'-1'", "the configured 9 s", 5.0)


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("s3cret-token", None),
        ("with inner spaces ok", None),
        ("~!@#$%^&*()_+{}|:<>?", None),
        ("tökén", "character 2 is a non-ASCII character (U+00F6)"),
        ("a\tb", "character 2 is a control character (U+0009)"),
        ("line\n", "character 5 is a control character (U+000A)"),
        ("del\x7f", "character 4 is a control character (U+007F)"),
        (" padded", "it starts or ends with a blank"),
        ("padded ", "it starts or ends with a blank"),
    ],
)
def test_tokens_a_client_can_send(token: str, problem: str | None) -> None:
    assert token_problem(token) == problem


def test_a_bad_token_is_one_line_that_never_quotes_it() -> None:
    check_api_token("")  # no token: mutations are simply off
    check_api_token("fine")
    with pytest.raises(ConfigError) as info:
        check_api_token("pässwörd-geheim")
    text = str(info.value)
    assert "\n" not in text and "geheim" not in text and "pässwörd" not in text
    assert text.startswith("api.token must be printable ASCII")
    with pytest.raises(ConfigError, match=r"^--token must"):
        check_api_token("é", "--token")
