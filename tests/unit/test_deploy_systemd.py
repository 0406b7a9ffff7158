"""deploy/systemd/bk-auditor.service against the exit codes and the notify protocol."""

from __future__ import annotations

from pathlib import Path

from auditor.daemon.service import EXIT_ELECTION_ENDED
from auditor.errors import ConfigError, ServiceUnavailableError
from auditor.metadata.cluster import NoClusterError

UNIT = Path(__file__).resolve().parents[2] / "deploy/systemd/bk-auditor.service"


def _service() -> dict[str, list[str]]:
    """The [Service] section's settings (a key given twice keeps both values)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_a_configuration_error_is_not_restarted_forever() -> None:
    s = _service()
    assert s["Restart"] == ["on-failure"]
    [prevented] = s["RestartPreventExitStatus"]
    assert set(prevented.split()) == {str(ConfigError.exit_code)} == {"2"}
    # What may heal by itself is still restarted.
    for code in (ServiceUnavailableError.exit_code, NoClusterError.exit_code, EXIT_ELECTION_ENDED):
        assert str(code) not in prevented.split()


def test_notify_and_watchdog() -> None:
    s = _service()
    assert s["Type"] == ["notify"]
    assert s["NotifyAccess"] == ["main"]  # READY, STATUS and WATCHDOG come from the main PID
    assert "WatchdogSec" in s
    assert "AF_UNIX" in s["RestrictAddressFamilies"][0].split()


def test_no_core_dumps() -> None:
    """Its memory holds the API token and ZooKeeper's password."""
    assert _service()["LimitCORE"] == ["0"]


def test_the_images_configuration_keeps_the_http_views_off_as_the_default_does() -> None:
    """One default, stated once: the README says the HTTP views are off unless asked for;
    the image's `deploy/auditor.toml` served them on 0.0.0.0:9878 without protect_reads."""
    import tomllib

    from auditor.daemon.config.sections import ApiConfig

    doc = tomllib.loads((UNIT.parents[1] / "auditor.toml").read_text(encoding="utf-8"))
    assert doc["api"]["http_port"] == ApiConfig().http_port == -1
