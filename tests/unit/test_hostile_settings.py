"""Every setting bounded in length and shape at load: one line, exit 2, nothing repeated.

Before: a 131 KB `BK_AUDITOR_DAEMON_IDENTITY` was accepted and repeated in every log line;
a 131 KB API token was accepted though no gRPC client can send it; a 131 KB (or merely
70-character-label) ZooKeeper connect string reached kazoo, whose connection thread printed
a UnicodeError traceback before the command failed on its connect timeout, the whole
string in the message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.config.values import MAX_SETTING_CHARS
from auditor.daemon.config import load_daemon_config
from auditor.daemon.config.identity import MAX_IDENTITY
from auditor.errors import ConfigError
from auditor.secretfiles import MAX_TOKEN_CHARS

HUGE = 131_000
ZK = {"BK_AUDITOR_DAEMON_ZK": "127.0.0.1:2181", "BK_AUDITOR_DAEMON_IDENTITY": "me:1"}


def _refused(env: dict[str, str], overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as caught:
        load_daemon_config(None, list(overrides), env={**ZK, **env})
    message = str(caught.value)
    assert "\n" not in message
    assert len(message) < 600, message
    return message


def test_a_huge_identity_is_refused_not_repeated() -> None:
    message = _refused({"BK_AUDITOR_DAEMON_IDENTITY": "a" * HUGE + ":3181"})
    assert f"daemon.identity is {HUGE + 5} characters long; a setting holds at most" in message
    message = _refused({"BK_AUDITOR_DAEMON_IDENTITY": "a" * 300 + ":3181"})
    assert f"longer than {MAX_IDENTITY} characters" in message
    assert "(305 characters)" in message
    # The longest host name with a port is still an identity.
    longest = "h" * 253 + ":65535"
    assert len(longest) == MAX_IDENTITY
    cfg = load_daemon_config(None, [], env={**ZK, "BK_AUDITOR_DAEMON_IDENTITY": longest})
    assert cfg.daemon.identity == longest


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("t" * HUGE, f"characters long; a setting holds at most {MAX_SETTING_CHARS}"),
        (
            "t" * (MAX_TOKEN_CHARS + 1),
            f"characters long; a setting holds at most {MAX_SETTING_CHARS}",
        ),
        (" padded", "it starts or ends with a blank"),
        ("zürich", "character 2 is a non-ASCII character (U+00FC)"),
        ("line\nbreak", "holds a control character ('\\n' at 4)"),
    ],
)
def test_a_token_no_client_can_send_is_refused_without_repeating_it(token: str, why: str) -> None:
    message = _refused({"BK_AUDITOR_API_TOKEN": token})
    assert why in message
    assert token[:20] not in message


def test_a_token_file_is_read_alike_by_the_daemon_and_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_file = tmp_path / "long"
    long_file.write_text("t" * HUGE + "\n")
    long_file.chmod(0o600)
    message = _refused({}, (f"api.token_file={long_file}",))
    assert f"longer than {MAX_TOKEN_CHARS} characters" in message
    assert main(["status", "--target", "127.0.0.1:1", f"--token-file={long_file}"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"longer than {MAX_TOKEN_CHARS} characters" in line
    # Whitespace around the token is no part of it, for both.
    spaced = tmp_path / "spaced"
    spaced.write_text("  s3cret \r\n")
    spaced.chmod(0o600)
    cfg = load_daemon_config(None, [f"api.token_file={spaced}"], env=ZK)
    assert cfg.api.token == "s3cret"


@pytest.mark.parametrize(
    ("connect", "why"),
    [
        ("a." * 200 + "b:2181", "is longer than DNS allows (253 characters)"),
        ("a" * 70 + ":2181", "has a label longer than DNS allows (63 characters)"),
        ("zk1:2181,zk2:99999", "is not HOST[:PORT] with a port 1..65535"),
        ("zk1:2181/a//b", "chroot '/a//b' is not a ZooKeeper path"),
    ],
)
def test_a_connect_string_is_checked_at_load(
    connect: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _refused({"BK_AUDITOR_DAEMON_ZK": connect})
    assert message.startswith("daemon.zk ")
    assert why in message
    assert main(["ledgers", "--zk", connect]) == 2
    err = capsys.readouterr().err
    [line] = err.splitlines()
    assert line.startswith("bk-auditor: error: --zk ")
    assert why in line
    assert len(line) < 600
    assert "Traceback" not in err


def test_a_huge_connect_string_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused({"BK_AUDITOR_DAEMON_ZK": "a" * HUGE + ":2181"})
    assert f"daemon.zk is {HUGE + 5} characters long; a setting holds at most" in message
    assert main(["ledgers", "--zk", "a" * HUGE + ":2181"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"({HUGE} characters) is longer than DNS allows (253 characters)" in line


def test_every_string_setting_is_bounded_and_free_of_control_characters() -> None:
    message = _refused({}, ("checks.racks_file=" + "r" * (MAX_SETTING_CHARS + 1),))
    assert f"checks.racks_file is {MAX_SETTING_CHARS + 1} characters long" in message
    message = _refused({"BK_AUDITOR_CHECKS_RACKS_FILE": "/etc/racks\x1b[2J.json"})
    assert "checks.racks_file holds a control character ('\\x1b' at 10)" in message
    # The bound is a bound, not a ban: a path of PATH_MAX characters is a setting.
    path = "/" + "p" * (MAX_SETTING_CHARS - 1)
    cfg = load_daemon_config(None, [f"checks.racks_file={path}"], env=ZK)
    assert cfg.checks.racks_file == path
