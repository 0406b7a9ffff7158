"""Completion scripts and the manual page, generated from the parser; flag names and the
cluster's address as every command takes them."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from auditor.cli import docs
from auditor.cli.cluster import NO_ADDRESS, Address, address_of
from auditor.cli.main import build_parser, main, package_version
from auditor.errors import ConfigError

PARSER = build_parser()
COMMANDS = docs.commands(PARSER)
NAMES = [c.name for c in COMMANDS]


def _sub(name: str) -> argparse.ArgumentParser:
    return docs._subparsers(PARSER).choices[name]


def test_commands_are_the_parsers() -> None:
    assert list(docs._subparsers(PARSER).choices) == NAMES
    assert {"ledgers", "check", "explain", "health", "completion", "man"} <= set(NAMES)
    assert len(NAMES) == len(set(NAMES)) == 26


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"bk-auditor {package_version()}\n"


def _bash_complete(script: str, *words: str) -> list[str]:
    """COMPREPLY when the cursor is on the last of `words` (after `bk-auditor`)."""
    line = " ".join(f"'{w}'" for w in ("bk-auditor", *words))
    proc = subprocess.run(
        [
            "bash",
            "--norc",
            "--noprofile",
            "-c",
            'eval "$1"; '
            f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; _bk_auditor; "
            'printf "%s\\n" "${COMPREPLY[@]}"',
            "bash",
            script,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert proc.stderr == ""
    return [w for w in proc.stdout.splitlines() if w]


def test_bash_completes_every_command_and_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert script == docs.bash_completion(PARSER)
    assert script.rstrip().endswith("complete -F _bk_auditor bk-auditor")
    assert _bash_complete(script, "") == ["-h", "--help", "--version", *NAMES]
    assert _bash_complete(script, "reco") == ["recover"]
    for c in COMMANDS:
        flags = [f for o in c.options for f in o.flags]
        assert _bash_complete(script, c.name, "-") == flags, c.name
    assert "--bk-conf" in _bash_complete(script, "--version", "ledgers", "--b")
    assert _bash_complete(script, "check", "") == [
        "bookies",
        "ledgers",
        "placement",
        "replicas",
        "grace",
        "metadata",
        "scrub",
        "all",
    ]
    assert _bash_complete(script, "scan", "--engine", "") == ["asyncio", "spark"]
    assert _bash_complete(script, "completion", "") == ["bash", "zsh"]
    assert _bash_complete(script, "explain", "1", "--zk", "") == []
    # hidden, deprecated aliases are not offered
    assert "--api" not in _bash_complete(script, "explain", "--")


def test_bash_completes_paths_for_files(tmp_path: Path) -> None:
    script = docs.bash_completion(PARSER)
    (tmp_path / "bk_server.conf").write_text("")
    prefix = str(tmp_path / "bk_")
    assert _bash_complete(script, "ledgers", "--bk-conf", prefix) == [f"{prefix}server.conf"]
    assert _bash_complete(script, "scan", "--out", str(tmp_path / "bk_")) == []


def test_zsh_names_every_command_and_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef bk-auditor\n")
    for c in COMMANDS:
        assert f"\n        {c.name})\n" in script, c.name
        assert f"\n        '{c.name}:" in script, c.name
        for o in c.options:
            for flag in o.flags:
                assert f"'{flag}:" in script, (c.name, flag)
    assert "'--api:" not in script
    assert shutil.which("zsh"), "zsh is missing: `make test` installs it (the zsh target)"
    subprocess.run(["zsh", "-n"], input=script, text=True, check=True, timeout=30)


#: zsh's completion functions stood in for by ones that print what they were given, so the
#: generated function can run outside a completion (zsh's own `words` and `CURRENT`).
_ZSH_STUBS = r"""
_describe() {
    local name=${@[-1]} item
    for item in "${(@P)name}"; do print -r -- "${item%%:*}"; done
}
compadd() { shift; print -rl -- "$@" }
_files() { print -r -- "<files $*>" }
"""


def _zsh_complete(script: str, *words: str) -> list[str]:
    """What the completion offers after `bk-auditor WORDS...` (the last word is the one
    being completed), run by a real zsh."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in ("bk-auditor", *words))
    program = (
        _ZSH_STUBS
        + script.replace('\n_bk_auditor "$@"\n', "\n")
        + f"\nwords=({quoted}); CURRENT={len(words) + 1}; _bk_auditor\n"
    )
    proc = subprocess.run(
        ["zsh", "-f"], input=program, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_zsh_completes_commands_options_choices_and_files() -> None:
    script = docs.zsh_completion(PARSER)
    assert _zsh_complete(script, "") == NAMES
    assert _zsh_complete(script, "-") == ["-h", "--help", "--version"]
    for c in COMMANDS:
        flags = [f for o in c.options for f in o.flags]
        assert _zsh_complete(script, c.name, "-") == flags, c.name
    assert _zsh_complete(script, "check", "") == [
        "bookies",
        "ledgers",
        "placement",
        "replicas",
        "grace",
        "metadata",
        "scrub",
        "all",
    ]
    assert _zsh_complete(script, "scan", "--engine", "") == ["asyncio", "spark"]
    assert _zsh_complete(script, "completion", "") == ["bash", "zsh"]
    assert _zsh_complete(script, "ledgers", "--bk-conf", "") == ["<files >"]
    assert _zsh_complete(script, "scan", "--out", "") == ["<files -/>"]
    assert _zsh_complete(script, "explain", "1", "--zk", "") == []
    assert "--api" not in _zsh_complete(script, "explain", "--")


def _roff(text: str) -> str:
    return text.replace("-", "\\-")


def test_man_names_every_command_and_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["man"]) == 0
    page = capsys.readouterr().out
    assert page.startswith(f'.TH BK-AUDITOR 1 "" "bk-auditor {_roff(package_version())}"')
    sections = page.split('\n.SS "')[1:]
    assert [s.split('"', 1)[0] for s in sections] == [_roff(n) for n in NAMES]
    for c, section in zip(COMMANDS, sections, strict=True):
        for action in _sub(c.name)._actions:
            if action.help == argparse.SUPPRESS:
                assert all(f"\\fB{_roff(f)}\\fR" not in section for f in action.option_strings)
                continue
            for flag in action.option_strings:
                assert f"\\fB{_roff(flag)}\\fR" in section, (c.name, flag)
    for name in ("BK_AUDITOR_ZK", "BK_AUDITOR_API_TOKEN", "BK_AUDITOR_ZK_AUTH"):
        assert f"\\fB{name}\\fR" in page
    assert "\n.SH EXIT STATUS\n" in page
    # no line a formatter would take for a request by accident
    for line in page.splitlines():
        assert not line.startswith("'")
        if line.startswith("."):
            assert line.split()[0] in {".TH", ".SH", ".SS", ".TP", ".PP", ".br"}, line
    if shutil.which("groff"):
        proc = subprocess.run(
            ["groff", "-ww", "-man", "-Tutf8"],
            input=page,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert proc.stderr == ""


def test_roff_escapes() -> None:
    assert docs._roff(".x") == "\\&.x"
    assert docs._roff("'x") == "\\&'x"
    assert docs._roff("a\\b-c") == "a\\eb\\-c"


# --- one flag name per thing, on every command --------------------------------------------


def test_every_command_reaching_zookeeper_takes_bk_conf() -> None:
    """Every one-shot command with --zk takes the same cluster flags (bookie-emulator is a
    test tool; `run` has the daemon's own --bk-conf and --zk)."""
    with_zk = {c.name for c in COMMANDS if any("--zk" in o.flags for o in c.options)}
    one_shot = with_zk - {"bookie-emulator", "run"}
    assert len(one_shot) == 17
    for c in COMMANDS:
        flags = {f for o in c.options for f in o.flags}
        if c.name in one_shot:
            assert {"--bk-conf", "--metadata-service-uri", "--zk-auth-file"} <= flags, c.name
    assert "--bk-conf" in {f for o in COMMANDS[NAMES.index("run")].options for f in o.flags}


def test_every_command_dialling_a_daemon_says_target() -> None:
    for c in COMMANDS:
        flags = {f for o in c.options for f in o.flags}
        if "--token" in flags or "--tls-ca" in flags:
            assert {"--target", "--token-file", "--token", "--tls", "--tls-ca"} <= flags, c.name
            assert "--api" not in flags, c.name
    help_text = _sub("trigger").format_help()
    assert "visible to every user of this host in ps" in " ".join(help_text.split())


# --- the cluster's address ----------------------------------------------------------------


def test_address_precedence(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("zkServers=conf1:2181, conf2:2181\nzkLedgersRootPath=/bk\n")
    env = {"BK_AUDITOR_ZK": "env:2181"}
    assert address_of("flag:2181", None, str(conf), env) == Address(zk="flag:2181")
    assert address_of(None, "zk://u:2181/l", str(conf), env) == Address(uri="zk://u:2181/l")
    assert address_of(None, None, str(conf), env) == Address(zk="env:2181")
    assert address_of(None, None, str(conf), {}) == Address(
        zk="conf1:2181,conf2:2181", ledgers_root="/bk"
    )
    uri_env = {"BK_AUDITOR_ZK": "metadata-store:zk:m:2181/pulsar"}
    assert address_of(None, None, None, uri_env) == Address(
        uri="metadata-store:zk:m:2181/pulsar", uri_label="environment BK_AUDITOR_ZK"
    )
    with pytest.raises(ConfigError) as info:
        address_of(None, None, None, {"BK_AUDITOR_ZK": ""})
    assert str(info.value) == NO_ADDRESS


def test_address_from_bk_conf_as_the_daemon_reads_it(tmp_path: Path) -> None:
    """metadataServiceUri over zkServers, zkEnableSecurity, Pulsar's variables applied."""
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "zkServers=ignored:2181\nmetadataServiceUri=zk+hierarchical://a:2181;b:2181/ledgers\n"
        "zkEnableSecurity=true\n"
    )
    assert address_of(None, None, str(conf), {}) == Address(
        uri="zk+hierarchical://a:2181;b:2181/ledgers",
        uri_label=f"{conf}:2 metadataServiceUri",
        enable_security=True,
    )
    conf.write_text("zkServers=file:2181\n")
    env = {"PULSAR_PREFIX_zkServers": "pulsar:2181"}
    assert address_of(None, None, str(conf), env) == Address(zk="pulsar:2181")
