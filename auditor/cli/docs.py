"""`bk-auditor completion bash|zsh` and `bk-auditor man`: generated from the argparse parser.

Both walk the same parser `bk-auditor` parses with, so a new command or flag appears in
the completion and the manual page without anyone editing them. Options whose help is
suppressed (deprecated aliases) are left out of both.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from auditor.cli.options import bind

PROG = "bk-auditor"

#: Metavars that name a file or a directory: their values complete as paths.
FILE_METAVARS = frozenset({"FILE"})
DIR_METAVARS = frozenset({"DIR"})

#: The environment the CLI reads, for the manual page.
ENVIRONMENT = (
    (
        "BK_AUDITOR_ZK",
        "the cluster's ZooKeeper connect string (or metadata service URI) "
        "when --zk and --metadata-service-uri are not given; --bk-conf is read only without it",
    ),
    ("BK_AUDITOR_ZK_AUTH", "ZooKeeper credentials, e.g. digest:USER:PASSWORD"),
    ("BK_AUDITOR_API_TARGET", "a daemon's gRPC API (HOST:PORT) for status, report, health"),
    ("BK_AUDITOR_API_TOKEN", "the daemon API's token (safer than --token, which ps shows)"),
    ("BK_AUDITOR_DEBUG", "set: tracebacks and kazoo's own logging on stderr"),
)

EXIT_STATUS = (
    ("0", "success (check, scan, explain, risk: nothing found)"),
    ("1", "a finding (violations, at risk), or an error in the data read"),
    ("2", "bad arguments or configuration"),
    ("3", "the metadata store, a bookie or the daemon cannot be reached"),
    ("70", "an internal error"),
)


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    metavar: str | None  # None: takes no value
    choices: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    #: Positional arguments: (metavar, their choices).
    positionals: tuple[tuple[str, tuple[str, ...]], ...]


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = prog
        with contextlib.suppress(KeyError, TypeError, ValueError):
            text = text % params
    return " ".join(text.split())


def _metavar(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return None
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper()


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    found = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        choices = tuple(map(str, action.choices)) if action.choices is not None else ()
        found.append(
            Option(
                tuple(action.option_strings),
                _metavar(action),
                choices,
                _help(action, parser.prog),
            )
        )
    return tuple(found)


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise ValueError(f"{parser.prog} has no subcommands")


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """Every subcommand, in the order `bk-auditor --help` lists them."""
    sub = _subparsers(parser)
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    out = []
    for name, p in sub.choices.items():
        positionals = tuple(
            (
                str(a.metavar or a.dest),
                tuple(map(str, a.choices)) if a.choices is not None else (),
            )
            for a in p._actions
            if not a.option_strings and a.help != argparse.SUPPRESS
        )
        out.append(Command(name, " ".join(helps.get(name, "").split()), _options(p), positionals))
    return out


def _top_options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    return _options(parser)


# --- bash ----------------------------------------------------------------------------------


def _words(items: Iterable[str]) -> str:
    return " ".join(items)


def _path_cases(opts: tuple[Option, ...], indent: str) -> list[str]:
    """`case "$prev"` arms: an option's choices, or paths for FILE/DIR values."""
    lines = []
    for o in opts:
        pattern = "|".join(o.flags)
        if o.choices:
            reply = f'compgen -W "{_words(o.choices)}" -- "$cur"'
        elif o.metavar in FILE_METAVARS:
            reply = 'compgen -f -- "$cur"'
        elif o.metavar in DIR_METAVARS:
            reply = 'compgen -d -- "$cur"'
        elif o.metavar is not None:
            reply = ""  # a value we cannot guess: offer nothing
        else:
            continue
        body = f"COMPREPLY=($({reply}))" if reply else "COMPREPLY=()"
        lines.append(f"{indent}{pattern}) {body}; return ;;")
    return lines


def bash_completion(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    top = _top_options(parser)
    top_words = _words([f for o in top for f in o.flags] + [c.name for c in cmds])
    lines = [
        f"# bash completion for {PROG}, generated by `{PROG} completion bash`.",
        f'# Install: {PROG} completion bash > /etc/bash_completion.d/{PROG}, or eval "$(...)"',
        "_bk_auditor() {",
        "    local cur prev cmd i opts words",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    cmd=""',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        "            -*) ;;",
        '            *) cmd="${COMP_WORDS[i]}"; break ;;',
        "        esac",
        "    done",
        '    if [[ -z "$cmd" ]]; then',
        f'        COMPREPLY=($(compgen -W "{top_words}" -- "$cur"))',
        "        return",
        "    fi",
        '    case "$cmd" in',
    ]
    for c in cmds:
        lines.append(f"        {c.name})")
        arms = _path_cases(c.options, " " * 16)
        if arms:
            lines.append('            case "$prev" in')
            lines.extend(arms)
            lines.append("            esac")
        opts = _words([f for o in c.options for f in o.flags])
        words = _words([w for _, choices in c.positionals for w in choices])
        lines.append(f'            opts="{opts}"')
        lines.append(f'            words="{words}"')
        lines.append("            ;;")
    lines += [
        "        *) return ;;",
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    fi",
        "}",
        f"complete -F _bk_auditor {PROG}",
    ]
    return "\n".join(lines) + "\n"


# --- zsh -----------------------------------------------------------------------------------


def _zq(text: str) -> str:
    """Single-quoted for zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _zdescribed(name: str, text: str) -> str:
    """`name:description` for `_describe`, a colon in the name escaped."""
    return _zq(name.replace(":", "\\:") + ":" + (text or name))


def zsh_completion(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    top = _top_options(parser)
    lines = [
        f"#compdef {PROG}",
        f"# zsh completion for {PROG}, generated by `{PROG} completion zsh`.",
        f'# Install: {PROG} completion zsh > "${{fpath[1]}}/_{PROG}" (then compinit).',
        "_bk_auditor() {",
        "    local cmd i",
        "    local -a commands opts choices",
        "    commands=(",
    ]
    lines += [f"        {_zdescribed(c.name, c.help)}" for c in cmds]
    lines += ["    )", '    cmd=""', "    for ((i = 2; i < CURRENT; i++)); do"]
    lines += [
        '        if [[ "${words[i]}" != -* ]]; then cmd="${words[i]}"; break; fi',
        "    done",
        '    if [[ -z "$cmd" ]]; then',
        '        if [[ "${words[CURRENT]}" == -* ]]; then',
        "            opts=(" + " ".join(_zdescribed(f, o.help) for o in top for f in o.flags) + ")",
        "            _describe -t options option opts",
        "        else",
        "            _describe -t commands command commands",
        "        fi",
        "        return",
        "    fi",
        '    case "$cmd" in',
    ]
    for c in cmds:
        lines.append(f"        {c.name})")
        arms = []
        for o in c.options:
            pattern = "|".join(o.flags)
            if o.choices:
                arms.append(f"{pattern}) compadd -- {' '.join(map(_zq, o.choices))}; return ;;")
            elif o.metavar in FILE_METAVARS:
                arms.append(f"{pattern}) _files; return ;;")
            elif o.metavar in DIR_METAVARS:
                arms.append(f"{pattern}) _files -/; return ;;")
            elif o.metavar is not None:
                arms.append(f"{pattern}) return ;;")
        if arms:
            lines.append('            case "${words[CURRENT-1]}" in')
            lines += [" " * 16 + a for a in arms]
            lines.append("            esac")
        lines.append(
            "            opts=("
            + " ".join(_zdescribed(f, o.help) for o in c.options for f in o.flags)
            + ")"
        )
        choices = [w for _, ch in c.positionals for w in ch]
        lines.append("            choices=(" + " ".join(map(_zq, choices)) + ")")
        lines.append("            ;;")
    lines += [
        "        *) return ;;",
        "    esac",
        '    if [[ "${words[CURRENT]}" == -* ]]; then',
        "        _describe -t options option opts",
        "    elif (( ${#choices} )); then",
        "        compadd -- $choices",
        "    fi",
        "}",
        '_bk_auditor "$@"',
    ]
    return "\n".join(lines) + "\n"


# --- man -----------------------------------------------------------------------------------


def _roff(text: str) -> str:
    """Text safe in roff: backslashes and hyphens escaped, no control character at a line's
    start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def _option_line(o: Option) -> str:
    flags = ", ".join(f"\\fB{_roff(f)}\\fR" for f in o.flags)
    return flags if o.metavar is None else f"{flags} \\fI{_roff(o.metavar)}\\fR"


def _usage(c: Command) -> str:
    parts = [f"\\fB{_roff(PROG)} {_roff(c.name)}\\fR"]
    parts += [f"\\fI{_roff(m)}\\fR" for m, _ in c.positionals]
    if c.options:
        parts.append("[\\fIOPTIONS\\fR]")
    return " ".join(parts)


def man_page(parser: argparse.ArgumentParser, version: str) -> str:
    """bk-auditor(1) in roff (man(7) macros): every command with each of its options."""
    cmds = commands(parser)
    lines = [
        f'.TH {PROG.upper()} 1 "" "{PROG} {_roff(version)}" "User Commands"',
        ".SH NAME",
        f"{_roff(PROG)} \\- {_roff(parser.description or '')}",
        ".SH SYNOPSIS",
        f"\\fB{_roff(PROG)}\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".br",
        f"\\fB{_roff(PROG)}\\fR \\fB\\-\\-version\\fR",
        ".SH DESCRIPTION",
        _roff(
            "Reads a BookKeeper cluster's metadata store and its bookies, and reports "
            "what is wrong; run as a daemon (run), it audits continuously and answers on a "
            "gRPC API (status, report, health, trigger). Errors are one line on stderr."
        ),
        ".SH OPTIONS",
    ]
    for o in _top_options(parser):
        lines += [".TP", _option_line(o), _roff(o.help)]
    lines.append(".SH COMMANDS")
    for c in cmds:
        lines += [f'.SS "{_roff(c.name)}"', _usage(c), ".PP", _roff(c.help or c.name)]
        for metavar, choices in c.positionals:
            if choices:
                lines += [
                    ".TP",
                    f"\\fI{_roff(metavar)}\\fR",
                    _roff("one of: " + ", ".join(choices)),
                ]
        for o in c.options:
            lines += [".TP", _option_line(o), _roff(o.help)]
            if o.choices:
                lines.append(_roff("One of: " + ", ".join(o.choices) + "."))
    lines.append(".SH ENVIRONMENT")
    for name, text in ENVIRONMENT:
        lines += [".TP", f"\\fB{_roff(name)}\\fR", _roff(text)]
    lines.append(".SH EXIT STATUS")
    for code, text in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", _roff(text)]
    lines += [".SH SEE ALSO", _roff("The README of bookkeeper-auditor; docs/runbook.md.")]
    return "\n".join(lines) + "\n"


def add_parsers(sub: Any, parser: argparse.ArgumentParser, version: str) -> None:
    """`completion` and `man`, generated from `parser` (the whole command line, `sub`'s
    parent: complete when they run) and `version` (the manual page's)."""
    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    comp.add_argument("shell", choices=["bash", "zsh"])

    async def completion_command(args: argparse.Namespace) -> int:
        script = bash_completion if args.shell == "bash" else zsh_completion
        sys.stdout.write(script(parser))
        return 0

    bind(comp, completion_command)
    man = sub.add_parser("man", help="print the manual page bk-auditor(1), in roff")

    async def man_command(args: argparse.Namespace) -> int:
        sys.stdout.write(man_page(parser, version))
        return 0

    bind(man, man_command)
