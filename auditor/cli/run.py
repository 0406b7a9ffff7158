"""`bk-auditor run`: the daemon, from configuration to exit code.

The daemon's modules are imported when it runs, not when the command line is parsed,
so that every other command starts without them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from auditor.cli.options import bind

if TYPE_CHECKING:
    from auditor.daemon.config import DaemonConfig
    from auditor.daemon.service import Daemon


def add_parsers(sub: Any) -> None:
    run = sub.add_parser("run", help="run the auditor daemon (contends for leadership)")
    run.add_argument("--config", metavar="FILE", help="TOML config file")
    run.add_argument("--bk-conf", metavar="FILE", help="BookKeeper's bk_server.conf to honour")
    run.add_argument("--zk", metavar="HOST:PORT[,...]", help="ZooKeeper (same as daemon.zk)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key (SECTION.KEY, or a BookKeeper key)",
    )
    bind(run, run_command)


async def run_command(args: argparse.Namespace) -> int:
    return await cmd_run(args.config, args.overrides, args.bk_conf, args.zk)


async def cmd_run(
    config: str | None, overrides: Sequence[str], bk_conf: str | None, zk: str | None
) -> int:
    from auditor.daemon.config import load_daemon_config
    from auditor.daemon.metrics import Metrics
    from auditor.daemon.sdnotify import Notifier
    from auditor.daemon.service import Daemon
    from auditor.logs import configure_logging

    extra = [*overrides, *([f"daemon.zk={zk}"] if zk else [])]

    def load() -> DaemonConfig:
        return load_daemon_config(config, extra, bk_conf=bk_conf)

    cfg = load()
    configure_logging(
        cfg.logging.format,  # type: ignore[arg-type]
        level=cfg.logging.level.upper(),
        capture_stdlib=True,
    )
    metrics = Metrics()

    def api_settings() -> dict[str, Any]:
        """What the gRPC API and the HTTP views share: address, token, TLS, protection."""
        api = cfg.api
        return {
            "host": api.host,
            "token": api.token or None,
            "tls_cert": api.tls_cert or None,
            "tls_key": api.tls_key or None,
            "tls_client_ca": api.tls_client_ca or None,
            "protect_reads": api.protect_reads,
        }

    async def api_factory(control: Daemon) -> Any:
        from auditor.api.server import start_api_server

        return await start_api_server(control, port=cfg.api.port, **api_settings())

    async def views_factory(control: Daemon) -> Any:
        from auditor.api.http import start_http_views

        return await start_http_views(
            control,
            port=cfg.api.http_port,
            max_connections=cfg.api.http_max_connections,
            header_timeout=cfg.api.http_header_timeout,
            **api_settings(),
        )

    notifier = Notifier()
    try:
        return await Daemon(cfg, reload=load, metrics=metrics).run(
            api_factory=api_factory, views_factory=views_factory, notify=notifier
        )
    finally:
        notifier.close()
