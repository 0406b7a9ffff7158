"""Where bookies are: network locations (racks, `/zone/upgradedomain`, `/region/rack`).

The placement check needs a location for every bookie named in an ensemble,
including bookies that are down: a location is a property of where a machine
sits, not of whether it answers right now (upstream forgets the rack of a bookie
as soon as it unregisters, which turns every outage into placement alarms).

Sources, consulted in this order for each bookie; the first that knows it wins,
and a bookie none of them knows gets the policy's default location:

1. `checks.racks_file`: a mapping file. JSON (`{"<key>": "<location>", ...}`),
   or, for names ending in `.yaml`/`.yml`, the flat YAML subset
   `<key>: <location>` one per line (comments, blank lines, `---`, single- or
   double-quoted scalars). Nested YAML is refused rather than half-read, since
   no YAML library is a dependency. A key is a bookie id, a `host:port`
   address, or a bare host name / IP.
2. `checks.racks_script`, else BookKeeper's `networkTopologyScriptFileName`:
   run as `script host1 host2 ...` with at most `networkTopologyScriptNumberArgs`
   hosts per call; stdout split on whitespace gives one location per host, in
   order. A wrong count leaves that batch unknown (upstream makes them all
   default; here a later source may still know them, else they become
   default). The hosts are the host part of the bookie's registered
   `bookie-rpc` address, else of the bookie id when it has the `host:port`
   form; no DNS normalisation is done (upstream passes IPs), so the script
   sees what the registration says. A bookie with neither (a down bookie with
   a custom id) is not passed.
3. Pulsar's rack znode, `checks.racks_znode` (default `/bookies`, at the
   ZooKeeper root of our connection, which is the chroot of a chrooted connect
   string), when it exists. Its JSON is `{group: {bookie id: {"rack": ...,
   "hostname": ...}}}`. A bookie is found by its id, then by its resolved
   `host:port`, then by host (the `hostname` field or the key's host part,
   used only when all entries for that host agree).

Locations are normalised as BookKeeper's `NodeBase.normalize` expects them:
a leading `/` is added when missing and trailing `/` are stripped; an empty
location or `/` means "unknown". Sources are loaded once per run and every
bookie is resolved at most once (results are cached per bookie id, script
answers per host).

Malformed sources are typed errors, never a crash and never a silent
fallback: a placement verdict computed from a half-read rack map would be
wrong, so the check refuses to run (exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from auditor.config import AuditorConfig
from auditor.errors import ConfigError, FormatError
from auditor.metadata.registry import address_from_id, resolve_bookie
from auditor.topology.locations import normalize_location
from auditor.zk import NoNodeError, ZkClient

#: Seconds a topology script may run before the check gives up on it.
SCRIPT_TIMEOUT = 30.0

Address = tuple[str, int]
AddressOf = Callable[[str], Awaitable[Address | None]]


class RackSourceError(FormatError):
    """A rack source that exists but cannot be used (bad JSON, failing script, ...).

    Exit code 2: the check could not run, because verdicts built on a broken
    rack map would be wrong.
    """

    exit_code = 2


# --- static mappings (file, znode) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StaticMapping:
    """A loaded key -> location table; `by_host` answers bookies by host name or IP."""

    name: str
    by_key: Mapping[str, str]
    by_host: Mapping[str, str]

    async def locate(self, bookies: Sequence[str], address_of: AddressOf) -> dict[str, str]:
        found = {b: loc for b in bookies if (loc := self.by_key.get(b)) is not None}
        misses = [b for b in bookies if b not in found]
        if not misses or not (self.by_key or self.by_host):
            return found
        addresses = await asyncio.gather(*(address_of(b) for b in misses))
        for bookie, addr in zip(misses, addresses, strict=True):
            if addr is None:
                continue
            loc = self.by_key.get(f"{addr[0]}:{addr[1]}") or self.by_host.get(addr[0])
            if loc is not None:
                found[bookie] = loc
        return found


def _unquote(token: str, source: str, lineno: int) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
        inner = token[1:-1]
        if token[0] == "'":
            return inner.replace("''", "'")
        try:
            value = json.loads(token)
        except json.JSONDecodeError as exc:
            raise RackSourceError(f"{source} line {lineno}: bad quoted string {token}") from exc
        return str(value)
    if token[:1] in ("'", '"'):
        raise RackSourceError(f"{source} line {lineno}: unterminated quoted string {token}")
    return token


_YAML_LINE = re.compile(
    r"""^(?P<key>"(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#'"{\[\-][^#]*?|-[^\s#][^#]*?)"""
    r"""\s*:(?:\s+(?P<value>.*?))?\s*$"""
)


_QUOTED_VALUE = re.compile(r"""^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*')\s*(?:#.*)?$""")


def _strip_comment(value: str) -> str:
    if value[:1] in ("'", '"'):
        m = _QUOTED_VALUE.match(value)
        return m.group(1) if m else value
    hit = re.search(r"\s#", value)
    return value[: hit.start()].rstrip() if hit else value


def parse_yaml_racks(text: str, source: str) -> dict[str, str]:
    """The flat `key: location` YAML subset; anything richer is refused."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        if line[:1].isspace():
            raise RackSourceError(
                f"{source} line {lineno}: nested YAML is not supported; "
                "use one `bookie: /rack` mapping per line, or JSON"
            )
        m = _YAML_LINE.match(stripped)
        if m is None:
            raise RackSourceError(
                f"{source} line {lineno}: expected `bookie: /rack`, got {stripped!r}"
            )
        # Stripped inside quotes too, as JSON keys are: no bookie id or host has spaces.
        key = _unquote(m.group("key").strip(), source, lineno).strip()
        raw = _strip_comment(m.group("value") or "")
        if raw[:1] in ("{", "[", "|", ">", "&", "*", "!"):
            raise RackSourceError(
                f"{source} line {lineno}: only plain or quoted scalar locations are supported"
            )
        if raw in ("", "~", "null", "Null", "NULL"):
            continue
        loc = normalize_location(_unquote(raw, source, lineno))
        if loc is not None:
            out[key] = loc
    return out


def parse_json_racks(text: str, source: str) -> dict[str, str]:
    """`{"<key>": "<location>", ...}`; null or empty locations mean unknown."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        # Besides JSONDecodeError: ValueError for an integer of more than 4300 digits,
        # RecursionError for arrays or objects nested about a thousand deep.
        raise RackSourceError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RackSourceError(
            f"{source} must be a JSON object mapping bookies to locations, "
            f"not {type(data).__name__}"
        )
    out: dict[str, str] = {}
    for key, value in data.items():
        if value is None:
            continue
        if not isinstance(value, str):
            raise RackSourceError(
                f"{source}: location of {key!r} must be a string, got {json.dumps(value)}"
            )
        loc = normalize_location(value)
        if loc is not None:
            out[key.strip()] = loc
    return out


def load_racks_file(path: str | Path) -> StaticMapping:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"checks.racks_file {p} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise RackSourceError(f"racks file {p} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"checks.racks_file {p} cannot be read: {exc}") from exc
    source = f"racks file {p}"
    if p.suffix.lower() in (".yaml", ".yml") and not text.lstrip().startswith("{"):
        mapping = parse_yaml_racks(text, source)
    else:
        mapping = parse_json_racks(text, source)
    return StaticMapping(f"file:{p}", mapping, mapping)


def _split_address(key: str) -> str | None:
    addr = address_from_id(key)
    return addr[0] if addr is not None else None


def parse_pulsar_racks(data: bytes, source: str) -> StaticMapping:
    """Pulsar's `BookiesRackConfiguration` JSON: `{group: {bookie: {"rack", "hostname"}}}`."""
    if not data.strip():
        return StaticMapping(f"znode:{source}", {}, {})
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise RackSourceError(f"rack znode {source} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RackSourceError(f"rack znode {source} must hold a JSON object of groups")
    by_key: dict[str, str] = {}
    by_host: dict[str, str | None] = {}

    def index_host(host: str | None, loc: str) -> None:
        if not host:
            return
        if host in by_host and by_host[host] != loc:
            by_host[host] = None  # several bookies on this host disagree: host says nothing
        else:
            by_host.setdefault(host, loc)

    for group, bookies in doc.items():
        if not isinstance(bookies, dict):
            raise RackSourceError(
                f"rack znode {source}: group {group!r} must be an object of bookies"
            )
        for bookie, info in bookies.items():
            if not isinstance(info, dict):
                raise RackSourceError(
                    f"rack znode {source}: entry {group}/{bookie} must be an object "
                    '{"rack": ..., "hostname": ...}'
                )
            rack = info.get("rack")
            hostname = info.get("hostname")
            if rack is not None and not isinstance(rack, str):
                raise RackSourceError(
                    f"rack znode {source}: rack of {group}/{bookie} must be a string"
                )
            if hostname is not None and not isinstance(hostname, str):
                raise RackSourceError(
                    f"rack znode {source}: hostname of {group}/{bookie} must be a string"
                )
            loc = normalize_location(rack) if rack is not None else None
            if loc is None:
                continue
            by_key.setdefault(bookie, loc)
            index_host(hostname, loc)
            index_host(_split_address(bookie), loc)
    hosts = {h: loc for h, loc in by_host.items() if loc is not None}
    return StaticMapping(f"znode:{source}", by_key, hosts)


async def load_rack_znode(zk: ZkClient, path: str) -> StaticMapping | None:
    """The Pulsar rack znode, or None when it does not exist."""
    try:
        data, _ = await zk.get(path)
    except NoNodeError:
        return None
    return parse_pulsar_racks(data, path)


# --- topology script ---------------------------------------------------------------


def parse_script_output(stdout: str, count: int) -> list[str | None] | None:
    """One location per host, in order; None when the count does not match."""
    tokens = stdout.split()
    if len(tokens) != count:
        return None
    return [normalize_location(t) for t in tokens]


async def run_topology_script(
    script: str, hosts: Sequence[str], *, time_limit: float = SCRIPT_TIMEOUT
) -> str:
    """Runs the script once with `hosts` as arguments and returns its stdout."""
    try:
        proc = await asyncio.create_subprocess_exec(
            script,
            *hosts,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise ConfigError(f"rack script {script} cannot be run: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), time_limit)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise RackSourceError(
            f"rack script {script} did not finish within {time_limit:g} s "
            f"({len(hosts)} host argument(s))"
        ) from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip()[-500:]
        raise RackSourceError(
            f"rack script {script} exited with status {proc.returncode}"
            + (f": {tail}" if tail else "")
        )
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RackSourceError(f"rack script {script} printed non-UTF-8 output: {exc}") from exc


@dataclass
class ScriptMapping:
    """BookKeeper's ScriptBasedMapping: hosts in batches, answers cached per host."""

    script: str
    max_args: int = 100
    timeout: float = SCRIPT_TIMEOUT
    log: Any = None
    _by_host: dict[str, str | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"script:{self.script}"

    async def locate(self, bookies: Sequence[str], address_of: AddressOf) -> dict[str, str]:
        addresses = await asyncio.gather(*(address_of(b) for b in bookies))
        hosts = {b: a[0] for b, a in zip(bookies, addresses, strict=True) if a is not None}
        todo = list(dict.fromkeys(h for h in hosts.values() if h not in self._by_host))
        for i in range(0, len(todo), self.max_args):
            batch = todo[i : i + self.max_args]
            out = await run_topology_script(self.script, batch, time_limit=self.timeout)
            answers = parse_script_output(out, len(batch))
            if answers is None:
                if self.log is not None:
                    self.log.warning(
                        "rack script answered the wrong number of locations; "
                        "those hosts get no location from it",
                        script=self.script,
                        hosts=batch,
                        output=out.strip()[:500],
                    )
                answers = [None] * len(batch)
            self._by_host.update(zip(batch, answers, strict=True))
        found: dict[str, str] = {}
        for bookie, host in hosts.items():
            loc = self._by_host.get(host)
            if loc is not None:
                found[bookie] = loc
        return found


def _check_script(script: str, key: str) -> None:
    p = Path(script)
    if not p.is_file():
        raise ConfigError(f"{key} {script} does not exist or is not a file")
    if not os.access(p, os.X_OK):
        raise ConfigError(f"{key} {script} is not executable")


# --- the resolver -----------------------------------------------------------------


class RackSource(Protocol):
    @property
    def name(self) -> str: ...

    async def locate(self, bookies: Sequence[str], address_of: AddressOf) -> dict[str, str]: ...


class RackResolver:
    """Bookie id -> location through the configured sources, each bookie resolved once."""

    def __init__(self, sources: Sequence[RackSource], address_of: AddressOf) -> None:
        self.sources = list(sources)
        self._address_of = address_of
        self._addresses: dict[str, Address | None] = {}
        self._cache: dict[str, tuple[str, str] | None] = {}

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]

    async def _address(self, bookie: str) -> Address | None:
        if bookie not in self._addresses:
            self._addresses[bookie] = await self._address_of(bookie)
        return self._addresses[bookie]

    async def locations(self, bookies: Iterable[str]) -> dict[str, str]:
        """Known locations of these bookies (unknown ones are absent: the policy defaults them)."""
        wanted = list(dict.fromkeys(bookies))
        remaining = [b for b in wanted if b not in self._cache]
        for source in self.sources:
            if not remaining:
                break
            found = await source.locate(remaining, self._address)
            for bookie, loc in found.items():
                self._cache[bookie] = (loc, source.name)
            remaining = [b for b in remaining if b not in found]
        for bookie in remaining:
            self._cache[bookie] = None
        out: dict[str, str] = {}
        for bookie in wanted:
            hit = self._cache.get(bookie)
            if hit is not None:
                out[bookie] = hit[0]
        return out

    def source_of(self, bookie: str) -> str | None:
        """Which source placed an already resolved bookie (for evidence)."""
        hit = self._cache.get(bookie)
        return hit[1] if hit is not None else None


async def open_rack_resolver(
    zk: ZkClient,
    root: str,
    config: AuditorConfig,
    *,
    log: Any = None,
    script_timeout: float = SCRIPT_TIMEOUT,
) -> RackResolver:
    """Loads the configured rack sources once; raises ConfigError / RackSourceError."""
    checks, bk = config.checks, config.bookkeeper
    sources: list[RackSource] = []
    if checks.racks_file:
        sources.append(load_racks_file(checks.racks_file))
    script, key = (
        (checks.racks_script, "checks.racks_script")
        if checks.racks_script
        else (bk.networkTopologyScriptFileName, "bookkeeper.networkTopologyScriptFileName")
    )
    if script:
        _check_script(script, key)
        sources.append(
            ScriptMapping(
                script, max_args=bk.networkTopologyScriptNumberArgs, timeout=script_timeout, log=log
            )
        )
    if checks.racks_znode:
        if not checks.racks_znode.startswith("/"):
            raise ConfigError(
                f"checks.racks_znode must be an absolute znode path, got {checks.racks_znode!r}"
            )
        znode = await load_rack_znode(zk, checks.racks_znode.rstrip("/") or "/")
        if znode is not None:
            sources.append(znode)

    async def address_of(bookie: str) -> Address | None:
        return await resolve_bookie(zk, root, bookie)

    return RackResolver(sources, address_of)
