"""The Java nodes of a cluster find its metadata from a `metadataServiceUri`, and the auditor
must land on the very tree they do, or it audits the wrong ledgers and joins the wrong
election; BookKeeper's and Pulsar's drivers read such URIs differently.

A cluster's `metadataServiceUri`, read as the Java nodes that share the cluster read it.

Two drivers write BookKeeper metadata to ZooKeeper, and they disagree on where it is
and on how the auditor election works, so the URI is parsed as each driver does:

* BookKeeper's own driver, `zk[+<manager>]://h1:2181;h2:2181/ledgers`: the path is
  the ledgers root (`java.net.URI.getPath`), the hosts are the authority.
* Pulsar's driver, `metadata-store:zk:h1:2181,h2:2181/pulsar?sessionTimeoutMillis=30000`
  (`MetadataStoreUrl` + `MetadataStoreConfigQueryParams` in pulsar-metadata). The
  whole URI is opaque to `java.net.URI`, so its path is null and the ledgers root is
  always `/ledgers`; whatever follows the hosts is a ZooKeeper chroot. Its
  `metadata-store:zk:h:2181/ledgers` keeps ledgers at `/ledgers/ledgers`: the Java
  nodes do, so we must too.

What Pulsar does, and so what we do (`docs`: README, "Metadata service URIs"):

* Before the first `?`, every `;` becomes `,`. A store prefix `zk:` is removed; a URL
  with no known prefix is a ZooKeeper connect string as it stands
  (`MetadataStoreFactoryImpl`), so `metadata-store:zk1:2181` is ZooKeeper too.
* `etcd:` selects etcd: `metadata-store:etcd:http://h1:2379,h2:2379` (Pulsar's
  `EtcdMetadataStore`: the same tree, kept as keys that are the full paths; an item
  without a scheme takes the previous item's, `http://` for the first). There is no
  chroot there, so a path after the endpoints is refused. `memory:`, `rocksdb:` and
  `oxia:` select stores we do not speak (no server of theirs can be reached by a
  process of ours, or, for Oxia, tested here): refused with one line.
* BookKeeper's own etcd driver, `etcd://h1:2379;h2:2379/<scope>`: the path is the
  scope under which BookKeeper keeps its keys (`metadata-drivers/etcd`), each host an
  `http://` endpoint, as `EtcdMetadataDriverBase` builds them.
* `metadata-store:zk://h:2181/x` is refused: Pulsar hands `//h:2181/x` to ZooKeeper,
  which reads it as a chroot of an empty host list and fails, so no Java node runs
  with it, and guessing what was meant could point us at another tree.
* Query keys known to Pulsar are validated with Pulsar's rules (a bad value or a
  missing `=value` is an error naming the key). `sessionTimeoutMillis` is used;
  the others tune the Java store's client (batching, read-only, threads) and mean
  nothing to us, so they are named in `ignored` for one log line. Pulsar passes
  unknown keys on to the store's URL; on ZooKeeper that would make them part of the
  chroot or of a port, which no working deployment can rely on, so they are named
  as ignored too rather than guessed at.

The host list and the chroot are checked here (HOST[:PORT], a port 1..65535, a
chroot by ZooKeeper's `PathUtils.validatePath`), so that a typo is one line at
start-up instead of a connection that never succeeds.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import unquote_plus

from auditor.errors import ConfigError, shown_name
from auditor.metadata.layout import DEFAULT_LEDGERS_ROOT, LedgerManager
from auditor.store import StoreKind


class MetadataDriver(enum.StrEnum):
    """Whose metadata driver the cluster's Java nodes run, and so whose election they use.

    BOOKKEEPER: BookKeeper's own ZooKeeper driver (`zk://`, `zk+hierarchical://`, a
    bare `--zk`): votes under `<root>/underreplication/auditorelection`.
    PULSAR: Pulsar's driver (`metadata-store:zk:...`): one ephemeral key
    `<root>/underreplication/leader` holding the leader's bookie id as a JSON string.
    ETCD: BookKeeper's own etcd driver (`etcd://`): no election and no under-replication
    manager upstream (apache/bookkeeper#3441); our auditors elect with a leader key of
    our own, `<scope>/bk-auditor/leader`, and never mark.
    """

    BOOKKEEPER = "bookkeeper"
    PULSAR = "pulsar"
    ETCD = "etcd"

    @property
    def marks(self) -> bool:
        """Whether the driver has an under-replication manager (marks a worker reads)."""
        return self is not MetadataDriver.ETCD


@dataclass(frozen=True, slots=True)
class MetadataServiceUri:
    """Where a cluster's metadata is, as its Java nodes find it."""

    #: A kazoo connect string: `h1:2181,h2:2181`, with Pulsar's chroot appended
    #: (`h1:2181,h2:2181/pulsar`); on etcd the endpoints, `http://h1:2379,http://h2:2379`.
    hosts: str
    #: The ledgers root inside the connection (under the chroot, if any).
    ledgers_root: str
    #: From `zk+<manager>://`; None: read it from the LAYOUT znode.
    manager: LedgerManager | None
    driver: MetadataDriver = MetadataDriver.BOOKKEEPER
    #: Pulsar's `sessionTimeoutMillis` query parameter, when given.
    session_timeout_ms: int | None = None
    #: Query parameter names that mean nothing to us, in order, each once.
    ignored: tuple[str, ...] = ()
    store: StoreKind = StoreKind.ZOOKEEPER
    #: Pulsar's `configFilePath` for an etcd store (its TLS and authority), when given.
    etcd_config: str | None = None


METADATA_STORE_SCHEME = "metadata-store:"
ZK_STORE_PREFIX = "zk:"
#: Pulsar's other stores (`MetadataStoreFactoryImpl`'s providers), by prefix.
ETCD_STORE_PREFIX = "etcd:"
REFUSED_STORES = {"oxia:": "Oxia", "rocksdb:": "RocksDB", "memory:": "memory"}
NOT_ZOOKEEPER = "bk-auditor speaks ZooKeeper and etcd only"

#: `MetadataStoreConfigQueryParams`: key -> the rule of its value.
_BOOLEAN, _NON_NEGATIVE, _POSITIVE, _STRING = "boolean", "non-negative", "positive", "string"
PULSAR_QUERY_KEYS = {
    "allowReadOnlyOperations": _BOOLEAN,
    "batchingEnabled": _BOOLEAN,
    "batchingMaxDelayMillis": _NON_NEGATIVE,
    "batchingMaxOperations": _POSITIVE,
    "batchingMaxSizeKb": _POSITIVE,
    "configFilePath": _STRING,
    "fsyncEnable": _BOOLEAN,
    "numSerDesThreads": _POSITIVE,
    "sessionTimeoutMillis": _POSITIVE,
}
SESSION_TIMEOUT_KEY = "sessionTimeoutMillis"
CONFIG_FILE_KEY = "configFilePath"
#: How many ignored names one note shows before "and N more".
IGNORED_SHOWN = 8

_FORMS = (
    "zk[+MANAGER]://HOST:PORT[;HOST:PORT...]/LEDGERS_ROOT, etcd://HOST:PORT[;...]/SCOPE, "
    "metadata-store:zk:HOST:PORT[,...][/CHROOT] or metadata-store:etcd:http://HOST:PORT[,...]"
)
_BOOKKEEPER_URI = re.compile(r"(?P<scheme>[a-z]+)(?:\+(?P<type>[a-z]+))?://(?P<rest>.*)", re.DOTALL)
_ENDPOINT = re.compile(r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<rest>.*)", re.DOTALL)
_STORE_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_HOST_PORT = re.compile(
    r"(?P<host>\[[0-9A-Za-z:.%]+\]|[^\s:/\[\]?#@]+)(?::(?P<port>[0-9]{1,5}))?", re.ASCII
)
_JAVA_INT = re.compile(r"[+-]?[0-9]{1,10}", re.ASCII)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
#: Characters ZooKeeper's PathUtils refuses in a path (Java strings: every character
#: outside the Basic Multilingual Plane is a surrogate pair, refused with the rest).
_BAD_PATH_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff]")


def parse_metadata_service_uri(
    uri: str, *, label: str = "metadataServiceUri"
) -> MetadataServiceUri:
    """Parses a `metadataServiceUri`; a ConfigError names `label` and the URI, bounded.

    `label` is how the caller's user set it (`--metadata-service-uri`,
    `daemon.metadata_service_uri`).
    """
    text = uri.strip()
    where = f"{label} {shown_name(text)}"
    if not text:
        raise ConfigError(f"{label} is empty: give {_FORMS}")
    if text.startswith(METADATA_STORE_SCHEME):
        return _parse_metadata_store(text[len(METADATA_STORE_SCHEME) :], where)
    return _parse_bookkeeper(text, where)


def check_connect_string(connect: str, label: str) -> str:
    """A ZooKeeper connect string (`HOST[:PORT][,HOST[:PORT]...][/CHROOT]`) as kazoo takes
    it, or a ConfigError naming `label`: the hosts as `metadata-store:zk:` takes them, the
    chroot by ZooKeeper's path rule. Checked at load, because kazoo meets a bad host only
    in its connection thread, as a traceback, after the connect timeout."""
    text = connect.strip()
    return _connect_string(text, f"{label} {shown_name(text)}")


def _connect_string(text: str, where: str) -> str:
    """HOSTS[/CHROOT] checked, as ZooKeeper's ConnectStringParser splits it: the chroot
    starts at the first '/'; a lone '/' is no chroot."""
    connect, slash, chroot = text.partition("/")
    hosts = _hosts(connect, where)
    if slash and chroot:
        _check_path("/" + chroot, "chroot", where)
        hosts += "/" + chroot
    return hosts


def describe_ignored(names: tuple[str, ...]) -> str:
    """One line naming the ignored query parameters, each bounded, at most IGNORED_SHOWN."""
    shown = ", ".join(shown_name(n) for n in names[:IGNORED_SHOWN])
    more = len(names) - IGNORED_SHOWN
    if more > 0:
        shown += f" and {more} more"
    return f"ignoring metadataServiceUri parameters {shown}: they tune the Java client only"


# --- BookKeeper's driver ---------------------------------------------------------------


def _parse_bookkeeper(text: str, where: str) -> MetadataServiceUri:
    m = _BOOKKEEPER_URI.fullmatch(text)
    if m is None:
        raise ConfigError(f"{where}: not a metadata service URI; give {_FORMS}")
    scheme = m["scheme"]
    if scheme == "etcd":
        return _parse_bookkeeper_etcd(m["type"], m["rest"], where)
    if scheme != "zk":
        raise ConfigError(
            f"{where}: unsupported metadata service scheme {shown_name(scheme)}; give {_FORMS}"
        )
    manager: LedgerManager | None = None
    if m["type"] and m["type"] != "null":
        try:
            manager = LedgerManager(m["type"])
            if manager is LedgerManager.ETCD:
                raise ValueError(manager)
        except ValueError:
            raise ConfigError(
                f"{where}: unsupported ledger manager type {shown_name(m['type'])} "
                f"(flat, legacyhierarchical, hierarchical, longhierarchical)"
            ) from None
    # java.net.URI: the authority ends at the first '/', '?' or '#'; the query and the
    # fragment are not part of the path BookKeeper takes as the ledgers root.
    rest, _, query = m["rest"].partition("?")
    rest = rest.partition("#")[0]
    authority, slash, path = rest.partition("/")
    hosts = _hosts(authority, where)
    root = ("/" + path).rstrip("/") if slash else ""
    root = root or DEFAULT_LEDGERS_ROOT
    _check_path(root, "ledgers root", where)
    ignored = tuple(dict.fromkeys(_query_key(p) for p in query.partition("#")[0].split("&") if p))
    return MetadataServiceUri(hosts, root, manager, MetadataDriver.BOOKKEEPER, None, ignored)


def _parse_bookkeeper_etcd(kind: str | None, rest: str, where: str) -> MetadataServiceUri:
    """`etcd://h1:2379;h2:2379/<scope>`, as BookKeeper's `EtcdMetadataDriverBase` reads it."""
    if kind:
        raise ConfigError(
            f"{where}: etcd:// takes no ledger manager type ({shown_name(kind)}): its "
            "ledger manager is the etcd driver's own"
        )
    rest, _, query = rest.partition("?")
    rest = rest.partition("#")[0]
    authority, slash, path = rest.partition("/")
    endpoints = ",".join(f"http://{h}" for h in _hosts(authority, where, store="etcd").split(","))
    scope = ("/" + path).rstrip("/") if slash else ""
    scope = scope or DEFAULT_LEDGERS_ROOT
    _check_path(scope, "scope", where)
    ignored = tuple(dict.fromkeys(_query_key(p) for p in query.partition("#")[0].split("&") if p))
    return MetadataServiceUri(
        endpoints, scope, LedgerManager.ETCD, MetadataDriver.ETCD, None, ignored, StoreKind.ETCD
    )


# --- Pulsar's driver -------------------------------------------------------------------


def _etcd_endpoints(url: str, where: str) -> str:
    """Pulsar's etcd endpoints (`http://h1:2379,h2:2379`) as full URLs, each checked."""
    scheme = "http"
    out: list[str] = []
    for item in (i.strip() for i in url.split(",")):
        if not item:
            continue
        m = _ENDPOINT.fullmatch(item)
        assert m is not None  # every string matches: the scheme is optional
        if m["scheme"]:
            scheme = m["scheme"].lower()
            if scheme not in ("http", "https"):
                raise ConfigError(
                    f"{where}: etcd endpoint {shown_name(item)} is not http:// or https://"
                )
        host, slash, path = m["rest"].partition("/")
        if slash and path:
            raise ConfigError(
                f"{where}: etcd endpoint {shown_name(item)} has a path: Pulsar's etcd store "
                "has no chroot (its keys are the full paths)"
            )
        checked = _hosts(host, where, store="etcd")
        if ":" not in checked.rsplit("]", 1)[-1]:
            checked += ":2379"
        out.append(f"{scheme}://{checked}")
    if not out:
        raise ConfigError(f"{where}: no etcd endpoint (give http://HOST:PORT[,HOST:PORT...])")
    return ",".join(out)


def _parse_metadata_store(body: str, where: str) -> MetadataServiceUri:
    url, _, query = body.partition("?")
    url = url.replace(";", ",")
    if url.startswith(ETCD_STORE_PREFIX):
        endpoints = _etcd_endpoints(url[len(ETCD_STORE_PREFIX) :], where)
        session_timeout, ignored, config_file = _pulsar_query(query, where)
        ignored = tuple(k for k in ignored if k != CONFIG_FILE_KEY)
        return MetadataServiceUri(
            endpoints,
            DEFAULT_LEDGERS_ROOT,
            None,
            MetadataDriver.PULSAR,
            session_timeout,
            ignored,
            StoreKind.ETCD,
            config_file,
        )
    for prefix, name in REFUSED_STORES.items():
        if url.startswith(prefix):
            raise ConfigError(
                f"{where}: the {name} metadata store is not supported ({NOT_ZOOKEEPER})"
            )
    if url.startswith(ZK_STORE_PREFIX):
        url = url[len(ZK_STORE_PREFIX) :]
        if url.startswith("//"):
            raise ConfigError(
                f"{where}: Pulsar does not accept 'zk://' (ZooKeeper would read '//...' as "
                "a chroot and find no host); write metadata-store:zk:HOST:PORT[,...][/CHROOT]"
            )
    else:
        other = _STORE_SCHEME.match(url)
        if other is not None:
            raise ConfigError(
                f"{where}: unknown metadata store {shown_name(other['scheme'])} "
                f"({NOT_ZOOKEEPER}: metadata-store:zk:HOST:PORT[,...][/CHROOT])"
            )
    session_timeout, ignored, _ = _pulsar_query(query, where)
    hosts = _connect_string(url, where)
    return MetadataServiceUri(
        hosts, DEFAULT_LEDGERS_ROOT, None, MetadataDriver.PULSAR, session_timeout, ignored
    )


def _pulsar_query(query: str, where: str) -> tuple[int | None, tuple[str, ...], str | None]:
    """`sessionTimeoutMillis`, the names of the other parameters, and `configFilePath`
    (the etcd store's configuration file), as Pulsar reads them."""
    session_timeout: int | None = None
    config_file: str | None = None
    ignored: dict[str, None] = {}
    for param in query.split("&"):
        if not param:
            continue
        sep = param.find("=")
        key = _decode(param[:sep] if sep > 0 else param, param, where)
        rule = PULSAR_QUERY_KEYS.get(key)
        if rule is None:
            ignored[key] = None
            continue
        if sep <= 0:
            raise ConfigError(
                f"{where}: query parameter {shown_name(key)} needs a value (key=value)"
            )
        value = _check_value(key, rule, _decode(param[sep + 1 :], param, where), where)
        if key == SESSION_TIMEOUT_KEY:
            session_timeout = value
            ignored.pop(key, None)
        elif key == CONFIG_FILE_KEY:
            # Named as ignored where it is (on ZooKeeper); the etcd store takes it out.
            config_file = _decode(param[sep + 1 :], param, where)
            ignored[key] = None
        else:
            ignored[key] = None
    return session_timeout, tuple(ignored), config_file


def _decode(text: str, param: str, where: str) -> str:
    """`URLDecoder.decode(text, UTF_8)`: '+' is a space; a broken %-escape is an error."""
    if _BAD_ESCAPE.search(text):
        raise ConfigError(f"{where}: query parameter {shown_name(param)} has a broken %-escape")
    return unquote_plus(text, errors="replace")


def _check_value(key: str, rule: str, value: str, where: str) -> int | None:
    """Pulsar's rule for `key`; the integer of an integer key."""
    got = shown_name(value)
    if rule == _STRING:
        return None
    if rule == _BOOLEAN:
        if value.isascii() and value.lower() in ("true", "false"):
            return None
        raise ConfigError(f"{where}: query parameter {key!r} must be true or false, got {got}")
    number = int(value) if _JAVA_INT.fullmatch(value) else None
    if number is None or not -(2**31) <= number < 2**31:
        raise ConfigError(f"{where}: query parameter {key!r} must be an integer, got {got}")
    if rule == _POSITIVE and number <= 0:
        raise ConfigError(f"{where}: query parameter {key!r} must be greater than 0, got {got}")
    if rule == _NON_NEGATIVE and number < 0:
        raise ConfigError(f"{where}: query parameter {key!r} must be >= 0, got {got}")
    return number


def _query_key(param: str) -> str:
    sep = param.find("=")
    return unquote_plus(param[:sep] if sep > 0 else param, errors="replace")


# --- what both share -------------------------------------------------------------------


def _hosts(connect: str, where: str, *, store: str = "ZooKeeper") -> str:
    """A ZooKeeper host list as kazoo takes it: HOST[:PORT] items joined by ','.

    Items are trimmed and empty ones skipped, as ZooKeeper's connect string parser
    does; BookKeeper's `;` separator is accepted too.
    """
    names = [h.strip() for h in re.split(r"[;,]", connect)]
    names = [h for h in names if h]
    if not names:
        raise ConfigError(f"{where}: no {store} host (give HOST:PORT[,HOST:PORT...])")
    for name in names:
        m = _HOST_PORT.fullmatch(name)
        port = m["port"] if m is not None else None
        if m is None or (port is not None and not 0 < int(port) < 65536):
            raise ConfigError(
                f"{where}: {store} host {shown_name(name)} is not HOST[:PORT] with a port 1..65535"
            )
        problem = _host_name_problem(m["host"])
        if problem:
            raise ConfigError(f"{where}: {store} host {shown_name(m['host'])} {problem}")
    return ",".join(names)


#: DNS's limits (RFC 1035): a name of at most 253 characters, each label at most 63.
MAX_HOST_NAME = 253
MAX_HOST_LABEL = 63


def _host_name_problem(host: str) -> str:
    """What DNS would refuse in `host` ("" when nothing): checked here, because kazoo's
    connection thread meets it in `getaddrinfo` as a UnicodeError traceback, retried until
    the connect timeout, and the long name is then repeated in every message."""
    if host.startswith("["):
        return ""
    if len(host) > MAX_HOST_NAME:
        return f"is longer than DNS allows ({MAX_HOST_NAME} characters)"
    if any(len(label) > MAX_HOST_LABEL for label in host.split(".")):
        return f"has a label longer than DNS allows ({MAX_HOST_LABEL} characters)"
    try:
        host.encode("idna")
    except UnicodeError as exc:
        return f"is not a host name DNS can carry ({exc})"
    return ""


def _check_path(path: str, what: str, where: str) -> None:
    """ZooKeeper's `PathUtils.validatePath`, for a chroot or a ledgers root."""
    problem = ""
    if path == "/":
        return
    if path.endswith("/"):
        problem = "it ends with '/'"
    elif "//" in path:
        problem = "it has an empty name"
    elif any(part in (".", "..") for part in path.split("/")):
        problem = "it has a relative name ('.' or '..')"
    elif _BAD_PATH_CHAR.search(path):
        problem = "it has a character ZooKeeper refuses"
    if problem:
        raise ConfigError(f"{where}: {what} {shown_name(path)} is not a ZooKeeper path: {problem}")
