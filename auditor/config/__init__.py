"""Operators already tune their bookies with `bk_server.conf`, so the auditor takes the same
keys to mean the same things, and refuses a bad value at start, naming the key, rather than
meet it in the middle of a check.

Configuration: BookKeeper's own knobs under their own names, and ours, validated.

The checks honour BookKeeper's keys with the same meaning and units, in the
`[bookkeeper]` table of a TOML file (`--set KEY=VALUE` overrides one). Knobs
BookKeeper has no word for (retry of unanswering bookies, probing, rack sources,
concurrency) live in `[checks]`. Every value is validated here, and a bad one is a
`ConfigError` that names the key (and where the value came from), so nothing
downstream meets a nonsensical setting.

- `model`: the sections (`BookKeeperConfig`, `ChecksConfig`, `AuditorConfig`)
  and each key's rule;
- `values`: values that remember their origin and `build_section`, which the
  daemon's layered configuration (`auditor.daemon.config`) is built from too;
- `load`: `load_config`, the one-shot commands' TOML file and `--set`;
- `properties`: the Java-properties reader for BookKeeper's `bk_server.conf`.

The names other packages use are importable from `auditor.config` itself.
"""

from auditor.config.load import TOML_TABLES, load_config
from auditor.config.model import (
    BK_RULES,
    CHECKS_RULES,
    RACKAWARE,
    SCRUB_RULES,
    AuditorConfig,
    BookKeeperConfig,
    ChecksConfig,
    ScrubConfig,
)
from auditor.config.values import (
    Rules,
    Setting,
    brief_repr,
    build_section,
    field_names,
    from_origin,
    match_key,
    normalize_key,
    parse_override,
    read_text,
    read_toml,
    unknown_key,
)

__all__ = [
    "BK_RULES",
    "CHECKS_RULES",
    "RACKAWARE",
    "SCRUB_RULES",
    "TOML_TABLES",
    "AuditorConfig",
    "BookKeeperConfig",
    "ChecksConfig",
    "Rules",
    "ScrubConfig",
    "Setting",
    "brief_repr",
    "build_section",
    "field_names",
    "from_origin",
    "load_config",
    "match_key",
    "normalize_key",
    "parse_override",
    "read_text",
    "read_toml",
    "unknown_key",
]
