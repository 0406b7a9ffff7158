"""`bk-auditor`: argument parsing, and the one place errors become exit codes.

Every failure an operator can cause or meet (bad flags, unreachable
ZooKeeper, corrupt znodes) is an `AuditorError` and is printed as one line on
stderr with a non-zero exit; a traceback would only be noise to them, so it is
shown only with BK_AUDITOR_DEBUG=1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import os
import re
import resource
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from auditor.cli import admin
from auditor.cli import explain as explain_cli
from auditor.cli.argtypes import MAX_DURATION, MAX_TIMEOUT, seconds
from auditor.cli.cluster import ZK_ENV, target_of_args
from auditor.errors import AuditorError, ConfigError, shown_name
from auditor.metadata.cluster import ClusterTarget
from auditor.scan.options import ENGINES

if TYPE_CHECKING:
    from auditor.cli.progress import ProgressBar
    from auditor.config import AuditorConfig

EXIT_INTERNAL = 70

#: The distribution whose metadata holds the version (pyproject.toml's `version`).
DISTRIBUTION = "bookkeeper-auditor"


def package_version() -> str:
    """The installed version: pyproject.toml's `version`, the one source of truth."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


#: A quoted token in argparse's message ('...'), which can be a whole argument.
_QUOTED = re.compile(r"'([^']*)'")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse quotes the offending argument whole: bound it (an argument can be
        # megabytes), so the error stays one readable line.
        bounded = _QUOTED.sub(lambda m: shown_name(m.group(1)), message)
        raise ConfigError(f"{self.prog}: {bounded}")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--zk",
        metavar="HOST:PORT[,...]",
        help=f"ZooKeeper connect string (else env {ZK_ENV}, else --bk-conf)",
    )
    p.add_argument(
        "--bk-conf",
        metavar="FILE",
        help="BookKeeper's bk_server.conf: the cluster from its metadataServiceUri or "
        "zkServers (and zkLedgersRootPath), when neither --zk nor " + ZK_ENV + " gives it",
    )
    p.add_argument(
        "--metadata-service-uri",
        metavar="URI",
        help="metadataServiceUri: zk+hierarchical://h1:2181;h2:2181/ledgers, or Pulsar's "
        "metadata-store:zk:h1:2181,h2:2181[/chroot] (ledgers at <chroot>/ledgers)",
    )
    p.add_argument("--ledgers-root", metavar="PATH", help="ledgers root (default /ledgers)")
    p.add_argument(
        "--timeout",
        type=seconds(MAX_TIMEOUT),
        default=10.0,
        help="seconds for connecting and for each call",
    )
    p.add_argument(
        "--zk-auth-file",
        metavar="FILE",
        help="ZooKeeper credentials, e.g. digest:USER:PASSWORD (or set BK_AUDITOR_ZK_AUTH)",
    )
    p.add_argument(
        "--zk-tls-config",
        metavar="FILE",
        help="ZooKeeper client properties (zookeeper.client.secure=true, zookeeper.ssl.*), "
        "as -Dzookeeper.client.config takes; also read from BK_AUDITOR_ZOOKEEPER_* and "
        "-D options in PULSAR_EXTRA_OPTS, BOOKIE_EXTRA_OPTS, JAVA_TOOL_OPTIONS",
    )
    p.add_argument(
        "--zk-enable-security",
        action="store_true",
        help="create znodes with creator-only ACLs, as BookKeeper's zkEnableSecurity "
        "(also bookkeeper.zkEnableSecurity in --config)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config ([bookkeeper], [checks])")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key (a BookKeeper key, or checks.KEY)",
    )


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="asyncio")
    p.add_argument("--master", default="", metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--partitions",
        type=int,
        default=0,
        metavar="N",
        help="id ranges to split the work into (default: 1 in process, 2 per Spark core)",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.executor.memory=2g (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bk-auditor", description="Audits an Apache BookKeeper cluster.")
    parser.add_argument("--version", action="version", version=f"bk-auditor {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _cluster_args(
        sub.add_parser("ledgers", help="list ledgers with state, quorum sizes and ensembles")
    )
    bookies = sub.add_parser("bookies", help="list bookies: state (writable, readonly, down), rack")
    _cluster_args(bookies)
    _config_args(bookies)
    bookies.add_argument(
        "--state",
        dest="states",
        action="append",
        default=[],
        choices=["writable", "readonly", "down"],
        help="only bookies in this state (repeatable)",
    )
    bookies.add_argument(
        "--rack",
        dest="racks",
        action="append",
        default=[],
        metavar="LOCATION",
        help="only bookies at this location, e.g. /rack-a (repeatable)",
    )
    lur = sub.add_parser("list-underreplicated", help="list ledgers marked under-replicated")
    _cluster_args(lur)
    lur.add_argument(
        "--missing-replica",
        metavar="BOOKIE",
        help="only marks whose missing replicas name this bookie",
    )
    lur.add_argument(
        "--exclude-missing-replica",
        metavar="BOOKIE",
        help="leave out marks whose missing replicas name this bookie",
    )
    lur.add_argument(
        "--count-only",
        action="store_true",
        help="print only the number of marks listed (without a filter: from the listings, "
        "no mark's data read, so a mark whose data is corrupt counts as a mark)",
    )
    lur.add_argument(
        "--iso-time",
        action="store_true",
        help="ctime in ISO 8601 (text), and ctime_iso besides ctime (--json)",
    )
    chk = sub.add_parser("check", help="run checks once; exit 0 clean, 1 violations, 2 error")
    chk.add_argument(
        "which",
        choices=["bookies", "ledgers", "placement", "replicas", "grace", "metadata", "all"],
    )
    _cluster_args(chk)
    _config_args(chk)
    chk.add_argument("--mark", action="store_true", help="write under-replication marks")
    _progress_args(chk)
    scan = sub.add_parser(
        "scan", help="bulk scrutiny in process or on Spark, to Parquet; exit 0 / 1 / 2"
    )
    _cluster_args(scan)
    _config_args(scan)
    _engine_args(scan)
    scan.add_argument(
        "--checks",
        default=None,
        metavar="LIST",
        help="comma-separated: replicas, placement, grace, metadata, pulsar (default: the "
        "first four; placement,metadata with --from-snapshot). pulsar: the Pulsar audit "
        "(pulsar-audit's findings; with replicas and placement, on their verdicts)",
    )
    scan.add_argument("--out", required=True, metavar="DIR", help="output directory")
    scan.add_argument("--overwrite", action="store_true", help="replace a previous output")
    scan.add_argument(
        "--mark", action="store_true", help="write under-replication marks (once, at the end)"
    )
    scan.add_argument(
        "--from-snapshot",
        metavar="DIR",
        help="judge a snapshot instead of the live cluster (placement, metadata)",
    )
    _progress_args(scan)
    snap = sub.add_parser("snapshot", help="write all ledger metadata as Parquet")
    _cluster_args(snap)
    _config_args(snap)
    _engine_args(snap)
    _progress_args(snap)
    snap.add_argument("--out", required=True, metavar="DIR", help="output directory")
    snap.add_argument("--overwrite", action="store_true", help="replace a previous snapshot")
    emu = sub.add_parser("bookie-emulator", help="run one emulated bookie (tests, demos)")
    emu.add_argument("--zk", required=True, metavar="HOST:PORT")
    emu.add_argument("--port", type=int, required=True)
    emu.add_argument("--host", default="127.0.0.1")
    emu.add_argument("--ledgers-root", default="/ledgers")
    emu.add_argument("--storage", choices=["sorted", "interleaved", "dbledger"], default="sorted")
    emu.add_argument("--readonly", action="store_true")
    demo = sub.add_parser("demo", help="the whole product on an embedded cluster")
    demo.add_argument(
        "--duration",
        type=seconds(MAX_DURATION),
        default=None,
        help="stop after this many seconds",
    )
    demo.add_argument(
        "--store",
        choices=("zookeeper", "etcd"),
        default="zookeeper",
        help="the metadata store: ZooKeeper (BookKeeper's election), or etcd with Pulsar's "
        "driver (metadata-store:etcd:, Pulsar's leader key)",
    )
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
    admin.add_parsers(sub, _cluster_args)
    explain_cli.add_parser(sub, _cluster_args, _config_args)
    from auditor.cli import pulsar_audit, risk

    risk.add_parsers(sub, _cluster_args, _config_args)
    pulsar_audit.add_parser(sub, _cluster_args, _config_args)
    from auditor.cli import selftest

    selftest.add_parser(sub)
    from auditor.cli import autorecovery_status, decommission, recover

    recover.add_parser(sub, _cluster_args, _config_args)
    decommission.add_parser(sub, _cluster_args, _config_args)
    autorecovery_status.add_parser(sub, _cluster_args)
    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    comp.add_argument("shell", choices=["bash", "zsh"])
    sub.add_parser("man", help="print the manual page bk-auditor(1), in roff")
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    from auditor.cli import inspect

    if args.command in ("completion", "man"):
        from auditor.cli import docs

        parser = build_parser()
        if args.command == "man":
            sys.stdout.write(docs.man_page(parser, package_version()))
        elif args.shell == "bash":
            sys.stdout.write(docs.bash_completion(parser))
        else:
            sys.stdout.write(docs.zsh_completion(parser))
        return 0

    commands: dict[str, Callable[[ClusterTarget, bool], Awaitable[int]]] = {
        "ledgers": inspect.cmd_ledgers,
    }
    if args.command in commands:
        return await commands[args.command](target_of_args(args), args.json)
    if args.command == "bookies":
        from auditor.config import load_config

        only = inspect.BookieFilter.of(args.states, args.racks)
        config = load_config(args.config, args.overrides)
        return await inspect.cmd_bookies(target_of_args(args, config), args.json, config, only)
    if args.command == "list-underreplicated":
        return await inspect.cmd_list_underreplicated(
            target_of_args(args),
            args.json,
            only=inspect.MarkFilter(args.missing_replica, args.exclude_missing_replica),
            count_only=args.count_only,
            iso_time=args.iso_time,
        )
    if args.command == "check":
        return await _failing_is_2(_check(args))
    if args.command == "selftest":
        from auditor.cli.selftest import cmd_selftest

        return cmd_selftest(args)
    if args.command == "explain":
        return await _failing_is_2(explain_cli.cmd_explain(args))
    if args.command in ("scan", "snapshot"):
        return await _failing_is_2(_scan(args))
    if args.command == "bookie-emulator":
        from auditor.testing.bookie import run_emulator

        if not 0 <= args.port < 65536:
            raise ConfigError(f"--port must be 0..65535, got {args.port}")
        task = asyncio.ensure_future(
            run_emulator(
                args.zk, args.host, args.port, args.ledgers_root, args.storage, args.readonly
            )
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        # Stopping by signal is the normal end: the emulator unregisters on the way out.
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return 0
    if args.command == "run":
        from auditor.cli.run import cmd_run

        return await cmd_run(args.config, args.overrides, args.bk_conf, args.zk)
    if args.command in ("risk", "what-if"):
        return await _failing_is_2(_risk(args))
    if args.command == "pulsar-audit":
        return await _failing_is_2(_pulsar_audit(args))
    if args.command == "recover":
        from auditor.cli import recover

        return await recover.dispatch(args)
    if args.command == "decommission":
        from auditor.cli import decommission

        return await decommission.dispatch(args)
    if args.command == "autorecovery-status":
        from auditor.cli.autorecovery_status import cmd_autorecovery_status

        return await cmd_autorecovery_status(target_of_args(args), args.json)
    if args.command in admin.COMMANDS:
        return await admin.dispatch(args)
    if args.command == "demo":
        from auditor.cli.sandbox import run_sandbox
        from auditor.store import StoreKind

        if args.duration is not None and args.duration < 0:
            raise ConfigError(f"--duration must be >= 0, got {args.duration:g}")
        return await run_sandbox(args.duration, StoreKind(args.store))
    raise ConfigError(f"unknown command {args.command!r}")


def _configure_logging() -> None:
    """Our own messages to stderr; kazoo's reconnect chatter only when debugging.

    kazoo logs every refused connection attempt as a warning, which would bury
    the one line that says what went wrong.
    """
    debug = bool(os.environ.get("BK_AUDITOR_DEBUG"))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="bk-auditor: %(levelname)s: %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kazoo").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)


async def _failing_is_2(run: Awaitable[int]) -> int:
    """For the commands whose exit 1 is a finding (`check`: violations; `explain`: a check
    flags the ledger; `scan`; `risk`/`what-if`: at risk), any failure to run is exit 2."""
    from auditor.logs import configure_logging

    configure_logging()
    try:
        return await run
    except AuditorError as exc:
        print(f"bk-auditor: error: {exc}", file=sys.stderr)
        return 2


def _progress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on a terminal (the periodic progress log line instead)",
    )


def _progress_bar(
    args: argparse.Namespace, config: AuditorConfig, *, scan: bool = False
) -> tuple[ProgressBar | None, AuditorConfig]:
    """A bar on a terminal (and its redraw interval, unless the user chose one)."""
    import dataclasses

    from auditor.cli import progress
    from auditor.config import ChecksConfig

    if args.no_progress or not progress.stderr_is_terminal(sys.stderr):
        return None, config
    bar = progress.install_bar(sys.stderr, scan=scan)
    if config.checks.progress_interval == ChecksConfig().progress_interval:
        checks = dataclasses.replace(config.checks, progress_interval=progress.BAR_INTERVAL)
        config = dataclasses.replace(config, checks=checks)
    return bar, config


async def _check(args: argparse.Namespace) -> int:
    from auditor.cli.check import cmd_check
    from auditor.config import load_config

    bar, config = _progress_bar(args, load_config(args.config, args.overrides))
    return await cmd_check(
        target_of_args(args, config),
        args.which,
        config,
        as_json=args.json,
        mark=args.mark,
        bar=bar,
    )


async def _scan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from auditor.cli import scan
    from auditor.config import load_config
    from auditor.scan.engine import EngineOptions

    bar, config = _progress_bar(args, load_config(args.config, args.overrides), scan=True)
    options = EngineOptions(args.engine, args.master, scan.parse_spark_conf(args.spark_conf))
    if args.command == "snapshot":
        return await scan.cmd_snapshot(
            target_of_args(args, config),
            config,
            options,
            args.partitions,
            Path(args.out),
            args.overwrite,
            bar=bar,
        )
    scan_args = scan.ScanArgs(
        checks=scan.parse_checks(
            args.checks
            or (scan.SNAPSHOT_DEFAULT_CHECKS if args.from_snapshot else scan.DEFAULT_CHECKS)
        ),
        engine=options,
        partitions=args.partitions,
        out=Path(args.out),
        mark=args.mark,
        overwrite=args.overwrite,
        as_json=args.json,
    )
    if args.from_snapshot:
        return await scan.cmd_scan_snapshot(Path(args.from_snapshot), config, scan_args, bar=bar)
    return await scan.cmd_scan(target_of_args(args, config), config, scan_args, bar=bar)


async def _risk(args: argparse.Namespace) -> int:
    """`risk` and `what-if`."""
    from auditor.cli import risk
    from auditor.config import load_config

    config = load_config(args.config, args.overrides)

    def target() -> ClusterTarget:
        return target_of_args(args, config)

    if args.command == "risk":
        return await risk.cmd_risk(
            target, config, top=args.top, snapshot=args.from_snapshot, as_json=args.json
        )
    request = risk.parse_request(args)
    return await risk.cmd_what_if(
        target, config, request, snapshot=args.from_snapshot, as_json=args.json
    )


async def _pulsar_audit(args: argparse.Namespace) -> int:
    import dataclasses

    from auditor.cli import pulsar_audit
    from auditor.config import load_config

    config = load_config(args.config, args.overrides)
    changed = {
        k: v
        for k, v in (("pulsar_metadata_zk", args.pulsar_zk), ("pulsar_root", args.pulsar_root))
        if v is not None
    }
    if changed:
        config = dataclasses.replace(config, checks=dataclasses.replace(config.checks, **changed))
    return await pulsar_audit.cmd_pulsar_audit(
        target_of_args(args, config),
        config,
        replicas=not args.no_replicas,
        top=args.top,
        as_json=args.json,
    )


def no_core_dumps() -> None:
    """No core file from this process: its memory holds the API token and ZooKeeper's
    password (a SIGABRT left a 142 MB core with both). The hard limit too, so nothing in
    the process raises it again; the unit file and the image say the same."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: Sequence[str] | None = None) -> int:
    no_core_dumps()
    _configure_logging()
    try:
        args = build_parser().parse_args(argv)
        return asyncio.run(_dispatch(args))
    except AuditorError as exc:
        print(f"bk-auditor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, unless asked for more
        if os.environ.get("BK_AUDITOR_DEBUG"):
            traceback.print_exc()
        print(f"bk-auditor: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
