"""The placement check needs a location for every bookie named in an ensemble, and
operators keep locations in several places (a file, BookKeeper's topology script, Pulsar's
`/bookies`); one resolver asks them in a fixed order and refuses a half-read map.

Where bookies are: network locations (racks, `/zone/upgradedomain`, `/region/rack`).

Bookies that are down need one too: a location is a property of where a machine
sits, not of whether it answers right now (upstream forgets the rack of a bookie
as soon as it unregisters, which turns every outage into placement alarms).

Sources, consulted in this order for each bookie; the first that knows it wins,
and a bookie none of them knows gets the policy's default location:

1. `checks.racks_file`: a JSON mapping file, `{"<key>": "<location>", ...}`.
   A key is a bookie id, a `host:port` address, or a bare host name / IP.
   YAML is refused (a `.yaml`/`.yml` name is a ConfigError saying to use
   JSON). BookKeeper has no YAML rack format (its mappings are the topology
   script and, with Pulsar, the `/bookies` znode's JSON), so YAML was our own
   invention; reading it well needs a YAML library, a dependency of the
   daemon on every bookie host for one optional file, and YAML 1.1 (what the
   maintained Python library reads) retypes exactly the scalars this file is
   made of: an unquoted `10:30` key is the integer 630, a host named `no` or
   `off` is `False`. A mapping that had to be quoted throughout to be read
   right is JSON already; the standard library reads that, strictly.
2. `checks.racks_script`, else BookKeeper's `networkTopologyScriptFileName`:
   run as `script host1 host2 ...` with at most `networkTopologyScriptNumberArgs`
   hosts per call; stdout split on whitespace gives one location per host, in
   order. A wrong count leaves that batch unknown (upstream makes them all
   default; here a later source may still know them, else they become
   default). The hosts are the host part of the bookie's registered
   `bookie-rpc` address, else of the bookie id when it has the `host:port`
   form; no DNS normalisation is done (upstream passes IPs), so the script
   sees what the registration says. A bookie with neither (a down bookie with
   a custom id) is not passed. The script is outside input, bounded as such
   (`script.py`): it runs in a process group of its own, killed as a whole
   (SIGKILL) when the call outlasts its time limit, so a child left holding
   stdout open cannot keep the check waiting; stdout is read as it comes and
   more than `SCRIPT_OUTPUT_CAP` bytes is an error (the group is killed at
   once); and every location it prints must be one BookKeeper's
   NetworkTopology takes (`locations.topology_location`: starts with `/`,
   names a level, no empty level; all of one depth), else the error names
   the script and the line.
3. Pulsar's rack znode, `checks.racks_znode` (default `/bookies`, at the
   ZooKeeper root of our connection, which is the chroot of a chrooted connect
   string), when it exists. Its JSON is `{group: {bookie id: {"rack": ...,
   "hostname": ...}}}`. A bookie is found by its id, then by its resolved
   `host:port`, then by host (the `hostname` field or the key's host part,
   used only when all entries for that host agree).

Locations from the file and the znode are normalised as BookKeeper's
`NodeBase.normalize` expects them: a leading `/` is added when missing and
trailing `/` are stripped; an empty location or `/` means "unknown" (in the
znode such an entry is named by the placement check as invalid input: the
default rack it falls to can hide a violation). Sources
are loaded once per run and every bookie is resolved at most once (results
are cached per bookie id, script answers per host).

Malformed sources are typed errors, never a crash and never a silent
fallback: a placement verdict computed from a half-read rack map would be
wrong, so the check refuses to run (exit 2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from auditor.config import AuditorConfig
from auditor.errors import ConfigError
from auditor.metadata.registry import address_from_id, resolve_bookie
from auditor.store import MetadataStore, NoNodeError
from auditor.topology.locations import normalize_location
from auditor.topology.script import (
    SCRIPT_OUTPUT_CAP,
    SCRIPT_TIMEOUT,
    ScriptMapping,
    check_script,
    parse_script_output,
)
from auditor.topology.sources import Address, AddressOf, RackSource, RackSourceError

__all__ = [
    "SCRIPT_OUTPUT_CAP",
    "SCRIPT_TIMEOUT",
    "Address",
    "AddressOf",
    "RackResolver",
    "RackSource",
    "RackSourceError",
    "ScriptMapping",
    "StaticMapping",
    "load_rack_znode",
    "load_racks_file",
    "open_rack_resolver",
    "open_rack_resolver_or_blind",
    "parse_json_racks",
    "parse_pulsar_racks",
    "parse_script_output",
]


# --- static mappings (file, znode) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StaticMapping:
    """A loaded key -> location table; `by_host` answers bookies by host name or IP."""

    name: str
    by_key: Mapping[str, str]
    by_host: Mapping[str, str]
    #: Entries read and not used, each (the source's path, why): a rack that names no
    #: rack. Its bookie falls to the policy's default location, which can hide a
    #: placement violation, so the placement check names each one.
    problems: tuple[tuple[str, str], ...] = ()

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


def parse_json_racks(
    text: str, source: str, problems: list[tuple[str, str]] | None = None
) -> dict[str, str]:
    """`{"<key>": "<location>", ...}`; a null location means unknown.

    A string that names no rack (`""`, `"/"`) is unknown too, as BookKeeper's default
    rack would take it, but it is no way to say so: each one goes to `problems` (the
    source, why), so that the placement check names it rather than let a violation
    disappear into the default rack.
    """
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
        elif problems is not None:
            problems.append(
                (
                    source,
                    f"{key!r}: rack {value!r} names no rack; the bookie takes the placement "
                    "policy's default rack (write null for a bookie whose rack is unknown)",
                )
            )
    return out


#: File name endings of YAML documents, which a racks file may not be (see the docstring).
YAML_SUFFIXES = (".yaml", ".yml")


def load_racks_file(path: str | Path) -> StaticMapping:
    """A JSON racks file; a YAML one is refused before it is read."""
    p = Path(path)
    if p.suffix.lower() in YAML_SUFFIXES:
        raise ConfigError(
            f"racks file {p} is YAML, which is not read: write the same mapping as a JSON "
            'object {"<bookie>": "</rack>"} in a .json file'
        )
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"checks.racks_file {p} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise RackSourceError(f"racks file {p} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"checks.racks_file {p} cannot be read: {exc}") from exc
    problems: list[tuple[str, str]] = []
    mapping = parse_json_racks(text, f"racks file {p}", problems)
    return StaticMapping(f"file:{p}", mapping, mapping, tuple(problems))


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
    problems: list[tuple[str, str]] = []

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
                if rack is not None:
                    problems.append(
                        (
                            source,
                            f"{group}/{bookie}: rack {rack!r} names no rack; the bookie "
                            "takes the placement policy's default rack",
                        )
                    )
                continue
            by_key.setdefault(bookie, loc)
            index_host(hostname, loc)
            index_host(_split_address(bookie), loc)
    hosts = {h: loc for h, loc in by_host.items() if loc is not None}
    return StaticMapping(f"znode:{source}", by_key, hosts, tuple(problems))


async def load_rack_znode(store: MetadataStore, path: str) -> StaticMapping | None:
    """The Pulsar rack znode, or None when it does not exist."""
    try:
        data, _ = await store.get(path)
    except NoNodeError:
        return None
    return parse_pulsar_racks(data, path)


# --- the resolver -----------------------------------------------------------------


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

    @property
    def problems(self) -> list[tuple[str, str]]:
        """Every source's entries read and not used: (path, why)."""
        return [p for s in self.sources if isinstance(s, StaticMapping) for p in s.problems]

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
    store: MetadataStore,
    root: str,
    config: AuditorConfig,
    *,
    log: Any = None,
    script_timeout: float = SCRIPT_TIMEOUT,
    script_output_cap: int = SCRIPT_OUTPUT_CAP,
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
        check_script(script, key)
        sources.append(
            ScriptMapping(
                script,
                max_args=bk.networkTopologyScriptNumberArgs,
                timeout=script_timeout,
                output_cap=script_output_cap,
                log=log,
            )
        )
    if checks.racks_znode:
        if not checks.racks_znode.startswith("/"):
            raise ConfigError(
                f"checks.racks_znode must be an absolute znode path, got {checks.racks_znode!r}"
            )
        znode = await load_rack_znode(store, checks.racks_znode.rstrip("/") or "/")
        if znode is not None:
            sources.append(znode)
    return RackResolver(sources, _registered_address(store, root))


def _registered_address(store: MetadataStore, root: str) -> AddressOf:
    """A bookie's address as its registration (or cookie) gives it."""

    async def address_of(bookie: str) -> Address | None:
        return await resolve_bookie(store, root, bookie)

    return address_of


async def open_rack_resolver_or_blind(
    store: MetadataStore, root: str, config: AuditorConfig, *, log: Any = None
) -> tuple[RackResolver, str | None]:
    """`open_rack_resolver`, or, when a configured source cannot be read (an invalid
    `/bookies`, a YAML racks file), a resolver that locates no bookie and why.

    For the commands that judge more than racks (`explain`, `risk`, `bookies`): they
    degrade as `check all` does (the placement check fails, the others run) instead of
    refusing to run at all, and say what they could not see; the caller makes that
    failure visible (a failed verdict, a warning, a non-zero exit).
    """
    try:
        return await open_rack_resolver(store, root, config, log=log), None
    except (ConfigError, RackSourceError) as exc:
        return RackResolver([], _registered_address(store, root)), str(exc)
