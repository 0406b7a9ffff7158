"""The daemon's identity: the id its election vote carries, and `whoisauditor` prints.

Java AutoRecovery votes with `BookieImpl.getBookieId(conf)` of the
bk_server.conf it was started with (`AutoRecoveryMain`). A daemon that
replaces it must vote with the same id, or the Java tools, a Java
AutoRecovery beside it and the operator see two names for one process. So
when no layer sets `daemon.identity` and the daemon is configured the way
BookKeeper is (`--bk-conf`, or Pulsar's `PULSAR_PREFIX_` variables), the id
follows upstream's rule (`BookieImpl.getBookieId` / `getBookieAddress`):

1. `bookieId`, as it is;
2. else `advertisedAddress` with `bookiePort`;
3. else the IP of `listeningInterface` ("default", when unset: the address
   this host's name resolves to) with `bookiePort`; with
   `useHostNameAsBookieID` that IP's canonical host name instead, cut at the
   first dot with `useShortHostName`.

Upstream refuses to start when the host of 2 or 3 is a loopback address and
`allowLoopback` is off (every host would then be 127.0.x.1:3181), or when it
does not resolve; so do we, in one line naming the keys, because a fall-back
would be exactly the id no Java process beside us uses. Without any
BookKeeper configuration there is no bookie to be named after, and the
daemon keeps `<hostname>:<api.port>`.

The look-ups are behind `HostFacts`, so the rule itself is pure and tested
exactly; `SystemHost` answers them the way the JVM does under Pulsar's
`-Djava.net.preferIPv4Stack=true` (IPv4 addresses).

Every id must be a valid BookKeeper bookie id, by the one rule the ledger
metadata uses too (`auditor.metadata.serde.is_valid_bookie_id`), or the Java
tools that read the vote would fail on it.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field
from typing import Protocol

from auditor.config import from_origin
from auditor.daemon.config.layers import BookieHints
from auditor.errors import ConfigError, shown_name
from auditor.metadata.registry import READONLY
from auditor.metadata.serde import is_valid_bookie_id

#: Java's name for "the interface this host's name resolves to" (`DNS.getDefaultIP`).
DEFAULT_INTERFACE = "default"
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_LOOKUP_ERRORS = (OSError, UnicodeError, ValueError, TypeError)


class HostFacts(Protocol):
    """The network look-ups upstream's rule makes, as the JVM would answer them."""

    def host_name(self) -> str:
        """This host's name (`gethostname`), for the rule without BookKeeper configuration."""
        ...

    def local_ip(self) -> str:
        """`InetAddress.getLocalHost().getHostAddress()`: this host's name resolved, else
        the address of `localhost` (`DNS.getDefaultIP("default")`)."""
        ...

    def interface_ip(self, name: str) -> str | None:
        """The first address of the network interface `name`; None if there is none."""
        ...

    def canonical_name(self, ip: str) -> str:
        """`InetAddress.getByName(ip).getCanonicalHostName()`: the name `ip` reverse-resolves
        to if that name resolves back to `ip`, else `ip` itself."""
        ...

    def resolve(self, host: str) -> str | None:
        """The address `host` (a name or an IP) resolves to; None if it does not."""
        ...


class SystemHost:
    """`HostFacts` from this machine's resolver and interfaces."""

    def host_name(self) -> str:
        return socket.gethostname()

    def local_ip(self) -> str:
        try:
            return socket.gethostbyname(socket.gethostname())
        except _LOOKUP_ERRORS:
            pass
        try:
            return socket.gethostbyname("localhost")
        except _LOOKUP_ERRORS:
            return "127.0.0.1"

    def interface_ip(self, name: str) -> str | None:
        import fcntl  # Unix only; imported where used so the module loads anywhere

        request = struct.pack("256s", name.encode("utf-8", "replace")[:15])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                return None
        return socket.inet_ntoa(answer[20:24])

    def canonical_name(self, ip: str) -> str:
        try:
            name = socket.gethostbyaddr(ip)[0]
            addresses = socket.gethostbyname_ex(name)[2]
        except _LOOKUP_ERRORS:
            return ip
        return name if ip in addresses else ip

    def resolve(self, host: str) -> str | None:
        literal = _ip_literal(host)
        if literal is not None:
            return literal
        try:
            return socket.gethostbyname(host)
        except _LOOKUP_ERRORS:
            return None


@dataclass(frozen=True, slots=True)
class StaticHost:
    """`HostFacts` with every answer fixed in advance, so that a test (or a fuzz run) never
    depends on the machine's resolver: `names` maps a host name to its address, `reverse`
    an address to its canonical name, `interfaces` an interface to its address."""

    name: str = "host-1"
    ip: str = "10.0.0.1"
    names: dict[str, str] = field(default_factory=dict)
    reverse: dict[str, str] = field(default_factory=dict)
    interfaces: dict[str, str] = field(default_factory=dict)

    def host_name(self) -> str:
        return self.name

    def local_ip(self) -> str:
        return self.ip

    def interface_ip(self, name: str) -> str | None:
        return self.interfaces.get(name)

    def canonical_name(self, ip: str) -> str:
        return self.reverse.get(ip, ip)

    def resolve(self, host: str) -> str | None:
        literal = _ip_literal(host)
        return literal if literal is not None else self.names.get(host)


def _ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


#: The longest identity: a DNS name (253) and `:` and a port. BookKeeper sets no bound on
#: a bookie id, but the identity is repeated in every log line, every vote and `status`.
MAX_IDENTITY = 253 + 1 + 5


def validate_identity(identity: str, origin: str = "") -> str:
    """BookKeeper accepts this as a BookieId (the vote's `bookieId`), at most
    `MAX_IDENTITY` characters long; else a ConfigError."""
    where = from_origin(origin)
    if len(identity) > MAX_IDENTITY:
        raise ConfigError(
            f"daemon.identity {shown_name(identity)} is longer than {MAX_IDENTITY} characters "
            f"(a host name and a port){where}"
        )
    if is_valid_bookie_id(identity):
        return identity
    if identity.lower() == READONLY:
        raise ConfigError(f"daemon.identity cannot be 'readonly' (BookKeeper reserves it){where}")
    raise ConfigError(
        f"daemon.identity {shown_name(identity)} is not a valid BookKeeper bookie id "
        f"(letters, digits and .-:;<=>?@[]^_ only){where}"
    )


def _port_note(hints: BookieHints) -> str:
    origin = hints.origins.get("bookiePort")
    if origin is None:
        return f"bookiePort {hints.port}, BookKeeper's default"
    return f"bookiePort from {origin}"


def _interface_ip(hints: BookieHints, host: HostFacts) -> tuple[str, str]:
    """`DNS.getDefaultIP(listeningInterface)`, and which interface that was."""
    iface = hints.listening_interface or DEFAULT_INTERFACE
    if iface == DEFAULT_INTERFACE:
        which = "the default interface (this host's name resolved)"
        return host.local_ip(), which
    origin = hints.origins["listeningInterface"]
    ip = host.interface_ip(iface)
    if ip is None:
        raise ConfigError(
            f"daemon.identity: listeningInterface {iface!r} is no network interface with an "
            f"IPv4 address here; set it to one, or set advertisedAddress, bookieId or "
            f"daemon.identity (from {origin})"
        )
    return ip, f"listeningInterface {iface} (from {origin})"


def bookkeeper_identity(hints: BookieHints, host: HostFacts) -> tuple[str, str]:
    """Upstream's `BookieImpl.getBookieId(conf)` on these hints: (id, the rule that gave it)."""
    if hints.bookie_id:
        origin = hints.origins["bookieId"]
        return validate_identity(hints.bookie_id, origin), origin
    if hints.advertised_address:
        address = hints.advertised_address
        how = f"advertisedAddress from {hints.origins['advertisedAddress']}"
    else:
        rule = f"BookKeeper's rule; {hints.source} sets neither bookieId nor advertisedAddress"
        ip, which = _interface_ip(hints, host)
        if not hints.use_host_name:
            address, how = ip, f"the IP of {which} ({rule})"
        else:
            flag = f"useHostNameAsBookieID from {hints.origins['useHostNameAsBookieID']}"
            address = host.canonical_name(ip)
            if address == ip:
                raise ConfigError(
                    f"daemon.identity: {ip}, the IP of {which}, has no host name, which "
                    f"BookKeeper refuses with useHostNameAsBookieID; fix this host's names, "
                    f"or set advertisedAddress, bookieId or daemon.identity (from {flag})"
                )
            how = f"the canonical host name of {ip}, the IP of {which}"
            if hints.use_short_host_name:
                address = address.split(".", 1)[0]
                short = hints.origins["useShortHostName"]
                how += f", cut at the first dot (useShortHostName from {short})"
            how += f" ({flag}; {rule})"
    origin = f"{how}; {_port_note(hints)}"
    identity = validate_identity(f"{address}:{hints.port}", origin)
    resolved = host.resolve(address)
    if resolved is None:
        raise ConfigError(
            f"daemon.identity: {address} does not resolve, and BookKeeper refuses a bookie "
            f"address that does not (from {origin})"
        )
    if _is_loopback(resolved) and not hints.allow_loopback:
        raise ConfigError(
            f"daemon.identity: {identity} is a loopback address ({resolved}), which BookKeeper "
            f"refuses unless allowLoopback=true; set listeningInterface or advertisedAddress "
            f"(or bookieId, or daemon.identity) (from {origin})"
        )
    return identity, origin


def resolve_identity(
    identity: str | None,
    origins: dict[str, str],
    hints: BookieHints | None,
    api_port: int,
    hostname: str | None,
    host: HostFacts | None = None,
) -> str:
    """`identity` when a layer set it, else the derived one; validated, its origin recorded.

    `hints` is None when the daemon has no BookKeeper configuration at all;
    then the id is `<hostname>:<api.port>`.
    """
    facts: HostFacts = host if host is not None else SystemHost()
    if identity is not None:
        origin = origins["daemon.identity"]
    elif hints is not None:
        identity, origin = bookkeeper_identity(hints, facts)
    else:
        identity = f"{hostname or facts.host_name()}:{api_port}"
        origin = "derived from the host name and api.port (no BookKeeper configuration)"
    origins["daemon.identity"] = origin
    return validate_identity(identity, origin)
