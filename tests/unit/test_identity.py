"""The daemon's identity by BookKeeper's rule (`BookieImpl.getBookieId`), one test per branch.

The network look-ups are answered by `StaticHost`, so every id and every
origin is exact and no test depends on this machine's resolver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.daemon.config import load_daemon_config
from auditor.daemon.config.identity import (
    StaticHost,
    SystemHost,
    bookkeeper_identity,
    resolve_identity,
)
from auditor.daemon.config.layers import BookieHints
from auditor.errors import ConfigError

POD_IP = "10.244.1.7"
FQDN = "bk-1.bookies.pulsar.svc.cluster.local"
HOST = StaticHost(
    name="bk-1",
    ip=POD_IP,
    names={FQDN: POD_IP, "bk-1": POD_IP, "bk-1.example": "10.0.0.7", "localhost": "127.0.0.1"},
    reverse={POD_IP: FQDN, "10.9.9.9": "eth1-name.example"},
    interfaces={"eth1": "10.9.9.9"},
)


class NoLookups:
    """A host whose every look-up fails the test: an explicit identity needs none."""

    def host_name(self) -> str:
        raise AssertionError("looked up")

    def local_ip(self) -> str:
        raise AssertionError("looked up")

    def interface_ip(self, name: str) -> str | None:
        raise AssertionError("looked up")

    def canonical_name(self, ip: str) -> str:
        raise AssertionError("looked up")

    def resolve(self, host: str) -> str | None:
        raise AssertionError("looked up")


def conf(tmp_path: Path, *lines: str) -> str:
    p = tmp_path / "bk_server.conf"
    p.write_text("\n".join(("zkServers=zk:2181", *lines)) + "\n")
    return str(p)


def identity(tmp_path: Path, *lines: str, host: StaticHost = HOST) -> tuple[str, str]:
    cfg = load_daemon_config(None, env={}, bk_conf=conf(tmp_path, *lines), host=host)
    return cfg.daemon.identity, cfg.origin("daemon.identity")


def test_bookie_id_wins_over_everything(tmp_path: Path) -> None:
    got = identity(
        tmp_path,
        "advertisedAddress=10.0.0.7",
        "useHostNameAsBookieID=true",
        "bookieId=bookie-7",
        "allowLoopback=false",
    )
    assert got == ("bookie-7", f"{tmp_path}/bk_server.conf:4 bookieId")


def test_bookie_id_is_not_resolved_nor_checked_for_loopback(tmp_path: Path) -> None:
    # Upstream returns a configured bookieId as it is (BookieId.parse only).
    assert identity(tmp_path, "bookieId=localhost")[0] == "localhost"


def test_advertised_address_with_bookie_port(tmp_path: Path) -> None:
    path = f"{tmp_path}/bk_server.conf"
    got = identity(
        tmp_path, "advertisedAddress= bk-1.example ", "bookiePort=4181", "listeningInterface=eth9"
    )
    assert got == (
        "bk-1.example:4181",
        f"advertisedAddress from {path}:2 advertisedAddress; bookiePort from {path}:3 bookiePort",
    )


def test_ip_of_the_default_interface_by_default(tmp_path: Path) -> None:
    assert identity(tmp_path) == (
        f"{POD_IP}:3181",
        "the IP of the default interface (this host's name resolved) (BookKeeper's rule; "
        f"{tmp_path}/bk_server.conf sets neither bookieId nor advertisedAddress); "
        "bookiePort 3181, BookKeeper's default",
    )
    # "default" named explicitly is the same interface.
    assert identity(tmp_path, "listeningInterface=default")[0] == f"{POD_IP}:3181"
    # useShortHostName alone changes nothing: it only cuts a host name.
    assert identity(tmp_path, "useShortHostName=true")[0] == f"{POD_IP}:3181"


def test_ip_of_the_listening_interface(tmp_path: Path) -> None:
    path = f"{tmp_path}/bk_server.conf"
    assert identity(tmp_path, "listeningInterface=eth1", "bookiePort=3182") == (
        "10.9.9.9:3182",
        f"the IP of listeningInterface eth1 (from {path}:2 listeningInterface) "
        f"(BookKeeper's rule; {path} sets neither bookieId nor advertisedAddress); "
        f"bookiePort from {path}:3 bookiePort",
    )


def test_unknown_listening_interface_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        identity(tmp_path, "listeningInterface=eth9")
    assert str(err.value) == (
        "daemon.identity: listeningInterface 'eth9' is no network interface with an IPv4 "
        "address here; set it to one, or set advertisedAddress, bookieId or daemon.identity "
        f"(from {tmp_path}/bk_server.conf:2 listeningInterface)"
    )


def test_canonical_host_name_when_asked(tmp_path: Path) -> None:
    path = f"{tmp_path}/bk_server.conf"
    assert identity(tmp_path, "useHostNameAsBookieID=true") == (
        f"{FQDN}:3181",
        f"the canonical host name of {POD_IP}, the IP of the default interface (this host's "
        f"name resolved) (useHostNameAsBookieID from {path}:2 useHostNameAsBookieID; "
        f"BookKeeper's rule; {path} sets neither bookieId nor advertisedAddress); "
        "bookiePort 3181, BookKeeper's default",
    )


def test_short_host_name_when_asked(tmp_path: Path) -> None:
    got = identity(tmp_path, "useHostNameAsBookieID=yes", "useShortHostName=TRUE")
    path = f"{tmp_path}/bk_server.conf"
    assert got == (
        "bk-1:3181",
        f"the canonical host name of {POD_IP}, the IP of the default interface (this host's "
        f"name resolved), cut at the first dot (useShortHostName from {path}:3 "
        f"useShortHostName) (useHostNameAsBookieID from {path}:2 useHostNameAsBookieID; "
        f"BookKeeper's rule; {path} sets neither bookieId nor advertisedAddress); "
        "bookiePort 3181, BookKeeper's default",
    )


def test_host_name_of_the_listening_interface(tmp_path: Path) -> None:
    host = StaticHost(
        ip=POD_IP,
        names={"eth1-name": "10.9.9.9"},
        reverse={"10.9.9.9": "eth1-name.example"},
        interfaces={"eth1": "10.9.9.9"},
    )
    lines = ("listeningInterface=eth1", "useHostNameAsBookieID=true", "useShortHostName=true")
    assert identity(tmp_path, *lines, host=host)[0] == "eth1-name:3181"


def test_host_name_asked_but_none_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        identity(tmp_path, "useHostNameAsBookieID=true", host=StaticHost(ip="10.1.1.1"))
    assert str(err.value) == (
        "daemon.identity: 10.1.1.1, the IP of the default interface (this host's name "
        "resolved), has no host name, which BookKeeper refuses with useHostNameAsBookieID; "
        "fix this host's names, or set advertisedAddress, bookieId or daemon.identity "
        f"(from useHostNameAsBookieID from {tmp_path}/bk_server.conf:2 useHostNameAsBookieID)"
    )


def test_loopback_is_refused_unless_allowed(tmp_path: Path) -> None:
    debian = StaticHost(ip="127.0.1.1")  # a host name in /etc/hosts as Debian writes it
    with pytest.raises(ConfigError) as err:
        identity(tmp_path, host=debian)
    assert str(err.value) == (
        "daemon.identity: 127.0.1.1:3181 is a loopback address (127.0.1.1), which BookKeeper "
        "refuses unless allowLoopback=true; set listeningInterface or advertisedAddress (or "
        "bookieId, or daemon.identity) (from the IP of the default interface (this host's "
        f"name resolved) (BookKeeper's rule; {tmp_path}/bk_server.conf sets neither bookieId "
        "nor advertisedAddress); bookiePort 3181, BookKeeper's default)"
    )
    assert identity(tmp_path, "allowLoopback=true", host=debian)[0] == "127.0.1.1:3181"
    # An advertised address is checked the same way, a name by what it resolves to.
    with pytest.raises(ConfigError, match=r"^daemon\.identity: localhost:3181 is a loopback"):
        identity(tmp_path, "advertisedAddress=localhost")
    assert identity(tmp_path, "advertisedAddress=localhost", "allowLoopback=on")[0] == (
        "localhost:3181"
    )


def test_an_address_that_does_not_resolve_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        identity(tmp_path, "advertisedAddress=nowhere.example")
    assert str(err.value) == (
        "daemon.identity: nowhere.example does not resolve, and BookKeeper refuses a bookie "
        "address that does not (from advertisedAddress from "
        f"{tmp_path}/bk_server.conf:2 advertisedAddress; bookiePort 3181, BookKeeper's default)"
    )


def test_bad_flags_name_key_and_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        identity(tmp_path, "useHostNameAsBookieID=maybe")
    assert str(err.value) == (
        "useHostNameAsBookieID must be true or false, got 'maybe' "
        f"(from {tmp_path}/bk_server.conf:2 useHostNameAsBookieID)"
    )


def test_without_bookkeeper_configuration_the_host_name_and_api_port() -> None:
    env = {"BK_AUDITOR_DAEMON_ZK": "zk:2181", "BK_AUDITOR_API_PORT": "7000"}
    cfg = load_daemon_config(None, env=env, host=HOST)
    assert cfg.daemon.identity == "bk-1:7000"
    assert cfg.origin("daemon.identity") == (
        "derived from the host name and api.port (no BookKeeper configuration)"
    )
    assert load_daemon_config(None, env=env, hostname="pod-x", host=HOST).daemon.identity == (
        "pod-x:7000"
    )


def test_an_explicit_identity_needs_no_look_up(tmp_path: Path) -> None:
    origins = {"daemon.identity": "--set"}
    hints = BookieHints(use_host_name=True, origins={"useHostNameAsBookieID": "x"})
    assert resolve_identity("auditor-a", origins, hints, 7000, None, NoLookups()) == "auditor-a"
    assert origins == {"daemon.identity": "--set"}
    cfg = load_daemon_config(
        None, ["daemon.identity=auditor-b"], env={}, bk_conf=conf(tmp_path), host=NoLookups()
    )
    assert cfg.daemon.identity == "auditor-b"


def test_the_rule_on_hints_directly() -> None:
    hints = BookieHints(port=3182, source="the environment")
    assert bookkeeper_identity(hints, HOST) == (
        f"{POD_IP}:3182",
        "the IP of the default interface (this host's name resolved) (BookKeeper's rule; the "
        "environment sets neither bookieId nor advertisedAddress); bookiePort 3182, "
        "BookKeeper's default",
    )


def test_system_host_answers_without_the_network() -> None:
    system = SystemHost()
    assert system.resolve("10.0.0.1") == "10.0.0.1"
    assert system.resolve("[::1]") == "::1"
    assert system.interface_ip("lo") == "127.0.0.1"
    assert system.interface_ip("no-such-if0") is None
    assert system.resolve("bad\x00name") is None
