"""A Pulsar on etcd keeps what its metadata URL cannot carry (TLS, the certificates'
authority) in a YAML file of its own, and the auditor should connect as the brokers do,
from that same file.

Pulsar's etcd configuration file (`configFilePath` of a `metadata-store:etcd:` URI).

Pulsar's etcd store reads this YAML file into its `EtcdConfig` for what the URL cannot
carry: TLS (`useTls`, `tlsTrustCertsFilePath`, `tlsCertificateFilePath`,
`tlsKeyFilePath`; `tlsProvider` picks a Java TLS engine and means nothing to us) and the
`authority` the servers' certificates are checked against. We read the same file, so
the auditor connects as the brokers do. A file that is missing, is not YAML or gives a
key a value of the wrong kind is a ConfigError naming the file and the key; a key we do
not know is named in one note and ignored, as Pulsar's mapper would not refuse it
either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from auditor.errors import ConfigError, shown_name

#: Keys read as paths, and the `EtcdOptions` field each fills.
_PATHS = {
    "tlsTrustCertsFilePath": "ca_file",
    "tlsCertificateFilePath": "cert_file",
    "tlsKeyFilePath": "key_file",
}
#: Keys that tune Java only.
_JAVA_ONLY = ("tlsProvider",)
#: A configuration file larger than this is refused unread (it is a handful of lines).
MAX_BYTES = 1 << 20
#: The longest `authority` (a host name, 253 characters, and a port).
MAX_AUTHORITY = 260


@dataclass(frozen=True, slots=True)
class EtcdOptions:
    """How to reach etcd beyond its endpoints: TLS files, the certificates' authority."""

    use_tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    authority: str | None = None
    #: Keys of the file that mean nothing to us, in order.
    ignored: tuple[str, ...] = ()


def read_etcd_config(path: str) -> EtcdOptions:
    """The options in Pulsar's etcd configuration file at `path`."""
    where = f"etcd configuration file {shown_name(path)} (configFilePath)"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.__class__.__name__}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_BYTES} bytes: not a configuration file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not YAML{at}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a configuration file") from None
    if data is None:
        return EtcdOptions()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a mapping of keys to values")
    fields: dict[str, object] = {}
    ignored: list[str] = []
    for key, value in data.items():
        name = str(key)
        if name == "useTls":
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: useTls must be true or false, got {value!r:.40}")
            fields["use_tls"] = value
        elif name in _PATHS or name == "authority":
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{where}: {name} must be a non-empty string")
            if name == "authority" and len(value.strip()) > MAX_AUTHORITY:
                raise ConfigError(f"{where}: authority is longer than a host name and port")
            fields[_PATHS.get(name, "authority")] = value.strip()
        else:
            ignored.append(shown_name(name) if name not in _JAVA_ONLY else name)
    options = EtcdOptions(ignored=tuple(ignored), **fields)  # type: ignore[arg-type]
    if (options.cert_file is None) != (options.key_file is None):
        raise ConfigError(
            f"{where}: a client certificate takes both tlsCertificateFilePath and tlsKeyFilePath"
        )
    for name, file in _PATHS.items():
        value = getattr(options, file)
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"{where}: {name} {shown_name(value)} is not a readable file")
    return options
