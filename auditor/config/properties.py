"""The auditor reads the very `bk_server.conf` its bookies read, and the file must mean the
same settings to both; no Python reader reads it as BookKeeper does.

BookKeeper's `bk_server.conf` as BookKeeper reads it: a hand-written Java-properties reader.

Why hand-written: BookKeeper (4.x, `AbstractConfiguration.loadConf`) reads its
server configuration with Apache Commons Configuration 1.x's
`PropertiesConfiguration`, whose dialect is not `java.util.Properties`. The
maintained Python readers (`javaproperties`, `jproperties`) follow
`java.util.Properties`; `configparser` wants sections and knows no backslash
continuation. None trims values or reads lists as Commons Configuration does,
so the same `bk_server.conf` would mean different settings to a bookie and to
its auditor. What counts for that file, and what this reader does:

- Comments and blanks: a line whose first non-blank character is `#` or `!` is
  a comment; blank lines are skipped.
- Continuation: a line ending in an odd number of backslashes continues on the
  next line, whose leading whitespace is dropped (an even number is escaped
  backslashes, not a continuation). A comment line never continues.
- Separators: the key ends at the first unescaped `=`, `:` or whitespace
  (space, tab, form feed); whitespace around the separator is skipped, and a
  separator after whitespace belongs to it (`key = value`, `key: value` and
  `key value` are the same; in `key==value` the value is `=value`).
- Trimming: values lose surrounding whitespace, which Commons Configuration
  trims and `java.util.Properties` keeps (a template's `zkTimeout=5000 `).
- Escapes: `\\t`, `\\n`, `\\r`, `\\f` and `\\uXXXX`; a backslash before any other
  character stands for that character (`spaced\\ key`, `a\\=b`).
- Comma lists: Commons Configuration splits an unescaped `,` into a list, and
  BookKeeper joins `zkServers` back with commas. This reader returns the text
  whole; the caller splits the keys that are lists (`auditor.daemon.config.layers`).

Where it knowingly differs (cases a real bk_server.conf rarely has): a
repeated key keeps its last value here, while Commons Configuration appends
it to a list whose first value BookKeeper's scalar getters take; `include =
FILE` is not followed; a line ending in an escaped space (`x\\ `) keeps the
space here, while Commons Configuration trims each line first, so there the
backslash continues the line; a `#` line inside a continuation is text here
and a skipped comment there; `\\b` and `\\,` are not special. Decoding the
file's bytes is the caller's (BookKeeper reads ISO-8859-1; the daemon decodes
with the locale's encoding, UTF-8 on any current system).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


def _odd_backslashes(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, logical line): comments and blanks dropped, continuations joined.

    A line ending in an odd number of backslashes continues on the next one,
    whose leading whitespace is dropped; a comment line never continues.
    """
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        lineno = i + 1
        part = lines[i].lstrip(_WS)
        i += 1
        if not part or part[0] in "#!":
            continue
        # Only the newest part is examined: the joined line ends in it, and what came
        # before ends in an even run of backslashes once its continuation one is cut,
        # so the parity is the part's own. Re-examining the whole line was quadratic.
        parts = [part]
        while _odd_backslashes(parts[-1]):
            parts[-1] = parts[-1][:-1]
            if i >= len(lines):
                break
            parts.append(lines[i].lstrip(_WS))
            i += 1
        yield lineno, "".join(parts)


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "\\" or i + 1 >= len(raw):
            out.append(c)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u" and _HEX4.fullmatch(raw[i + 2 : i + 6]):
            out.append(chr(int(raw[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_property(line: str) -> tuple[str, str]:
    """Key and raw value: the key ends at the first unescaped `=`, `:` or whitespace."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c in _WS:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WS)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WS)
    # Trailing whitespace is dropped (Commons Configuration trims values) unless escaped.
    trimmed = rest.rstrip(_WS)
    if trimmed != rest and _odd_backslashes(trimmed):
        trimmed = rest[: len(trimmed) + 1]
    return key, trimmed


def property_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, key, value) for every property of a Java properties text, in order."""
    for lineno, line in _logical_lines(text):
        key, value = _split_property(line)
        yield lineno, _unescape(key), _unescape(value)


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties text as a dict; a repeated key keeps its last value."""
    return {key: value for _, key, value in property_lines(text)}
