"""The daemon's configuration: four layers over the checks' own, each value remembering its origin.

Precedence, lowest first: built-in defaults < `--bk-conf bk_server.conf` <
the TOML file < environment `BK_AUDITOR_<SECTION>_<KEY>` < `--set
SECTION.KEY=VALUE`. The bookie's own `bk_server.conf` can therefore be the
whole configuration of a daemon running beside it, and a container can be
configured by environment alone.

`[scan]` configures the Spark job the leader runs its placement and replicas
checks through when `daemon.engine = "spark"` (`auditor.daemon.scan_driver`);
PySpark must then be importable, which is checked at start and on reload.

The package, by seam:

- `sections`: the daemon's tables (`[daemon]`, `[api]`, ...), defaults and rules;
- `resolved`: `DaemonConfig`, the merged whole (origins, `changed`, `describe`);
- `layers`: what bk_server.conf (with Pulsar's `PULSAR_PREFIX_` variables), the TOML file,
  the environment and `--set` say;
- `identity`: the election vote's id, by BookKeeper's rule beside a bookie (its network
  look-ups behind `HostFacts`), validated as a BookKeeper bookie id;
- `credentials`: the API's TLS files and token, ZooKeeper credentials;
- `load`: `load_daemon_config`, merging, validating and deriving.

`from auditor.daemon.config import X` keeps working for the names below.
"""

from auditor.daemon.config.credentials import DAEMON_ZK_HINT
from auditor.daemon.config.identity import validate_identity
from auditor.daemon.config.layers import CLIENT_ONLY_ENV, DEFAULT_BOOKIE_PORT, ENV_PREFIX
from auditor.daemon.config.load import (
    DAEMON_PLACEMENT_INTERVAL,
    DAEMON_REPLICAS_INTERVAL,
    load_daemon_config,
)
from auditor.daemon.config.resolved import DaemonConfig
from auditor.daemon.config.sections import (
    DEFAULT_API_PORT,
    DEFAULT_METRICS_PORT,
    LOG_FORMATS,
    LOG_LEVELS,
    SECTIONS,
    ApiConfig,
    DaemonSection,
    LoggingConfig,
    MetricsConfig,
    PulsarSection,
    RiskSection,
    ScanSection,
    SelfTestSection,
)

__all__ = [
    "CLIENT_ONLY_ENV",
    "DAEMON_PLACEMENT_INTERVAL",
    "DAEMON_REPLICAS_INTERVAL",
    "DAEMON_ZK_HINT",
    "DEFAULT_API_PORT",
    "DEFAULT_BOOKIE_PORT",
    "DEFAULT_METRICS_PORT",
    "ENV_PREFIX",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SECTIONS",
    "ApiConfig",
    "DaemonConfig",
    "DaemonSection",
    "LoggingConfig",
    "MetricsConfig",
    "PulsarSection",
    "RiskSection",
    "ScanSection",
    "SelfTestSection",
    "load_daemon_config",
    "validate_identity",
]
