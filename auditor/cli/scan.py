"""`bk-auditor scan` and `bk-auditor snapshot`: the bulk scrutiny, in process or on Spark.

Exit codes are those of `check`: 0 no violation, 1 violations found, 2 the
scan could not run. Input is validated before anything is written: the
output directory, the engine's packages and the cluster connection are all
checked first, and `summary.json` is written last, so a directory without it
is an interrupted scan. An output directory that cannot be written, found
before the scan or when the disk fills up during it, is exit 2 with one line
(`auditor.scan.output.OutputError`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from auditor.checks.context import open_context
from auditor.checks.findings import Check
from auditor.cli.check import render_text
from auditor.cli.cluster import target_of_args
from auditor.cli.options import bind, cluster_args, config_args, engine_args, progress_args
from auditor.cli.progress import ProgressBar, progress_bar
from auditor.config import AuditorConfig, load_config
from auditor.errors import ConfigError
from auditor.metadata.cluster import ClusterTarget, connect
from auditor.scan.engine import EngineOptions, require
from auditor.scan.engines import start_engine
from auditor.scan.job import (
    SCAN_CHECKS,
    ScanResult,
    run_scan,
    run_scan_from_snapshot,
    run_snapshot,
)
from auditor.scan.options import spark_settings
from auditor.scan.output import (
    SCAN_OUTPUT,
    check_out_dir,
    prepare_out_dir,
    summary_document,
    writing_to,
)
from auditor.scan.partition import ScanSpec
from auditor.scan.snapshot import (
    SNAPSHOT_OUTPUT,
    SnapshotCluster,
    SnapshotJudge,
    snapshot_checks,
)

DEFAULT_CHECKS = "replicas,placement,grace,metadata"
SNAPSHOT_DEFAULT_CHECKS = "placement,metadata"


@dataclass(frozen=True, slots=True)
class ScanArgs:
    checks: tuple[Check, ...]
    engine: EngineOptions
    partitions: int
    out: Path
    mark: bool = False
    overwrite: bool = False
    as_json: bool = False


def parse_checks(text: str, allowed: Sequence[Check] = SCAN_CHECKS) -> tuple[Check, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--checks names no check")
    valid = {str(c): c for c in allowed}
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ConfigError(
            f"--checks: unknown check {unknown[0]!r}; expected some of {', '.join(valid)}"
        )
    return tuple(c for c in allowed if str(c) in names)


def parse_spark_conf(pairs: Sequence[str]) -> dict[str, str]:
    """Repeated `--spark-conf spark.KEY=VALUE`, by the daemon's `scan.spark_conf` rule."""
    return spark_settings(pairs, label="--spark-conf", form="spark.KEY=VALUE")


def _print(result: ScanResult, as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(json.dumps(summary_document(result.reports, result.pulsar)) + "\n")
        return
    for report in result.reports:
        if report.check is Check.PULSAR and result.pulsar is not None:
            from auditor.cli import pulsar_audit

            replicas = any(r.check is Check.REPLICAS for r in result.reports)
            doc = pulsar_audit.document(
                report, result.pulsar, replicas=replicas, top=pulsar_audit.DEFAULT_TOP
            )
            pulsar_audit.render_text(doc, out)
        else:
            render_text(report, out)


@contextmanager
def _drawn(bar: ProgressBar | None, what: str) -> Iterator[None]:
    """The bar finished at 100% when the run ends, or left as it is when it fails."""
    if bar is None:
        yield
        return
    bar.begin("")
    try:
        yield
    except BaseException:
        bar.abandon()
        raise
    bar.finish_scan(what)


async def cmd_scan(
    target: ClusterTarget,
    config: AuditorConfig,
    args: ScanArgs,
    out: TextIO = sys.stdout,
    bar: ProgressBar | None = None,
) -> int:
    if args.partitions < 0:
        raise ConfigError(
            f"--partitions must be >= 0 (0: the engine's default), got {args.partitions}"
        )
    check_out_dir(args.out, SCAN_OUTPUT, overwrite=args.overwrite)
    require(args.engine, parquet=True)
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config, mark=args.mark) as ctx,
    ):
        with writing_to(args.out):
            prepare_out_dir(args.out, SCAN_OUTPUT, overwrite=args.overwrite)
            engine = await start_engine(args.engine, args.out)
            try:
                spec = ScanSpec(replace(target, manager=manager), config, args.checks)
                with _drawn(bar, "scan"):
                    result = await run_scan(
                        ctx,
                        engine,
                        spec,
                        partitions=args.partitions or engine.default_partitions(),
                        out=args.out,
                    )
            finally:
                await engine.close()
    _print(result, args.as_json, out)
    return 1 if result.has_findings else 0


async def cmd_snapshot(
    target: ClusterTarget,
    config: AuditorConfig,
    engine_options: EngineOptions,
    partitions: int,
    out_dir: Path,
    overwrite: bool,
    out: TextIO = sys.stdout,
    bar: ProgressBar | None = None,
) -> int:
    if partitions < 0:
        raise ConfigError(f"--partitions must be >= 0 (0: the engine's default), got {partitions}")
    check_out_dir(out_dir, SNAPSHOT_OUTPUT, overwrite=overwrite)
    require(engine_options, parquet=True)
    async with (
        connect(target) as (store, manager),
        open_context(store, target.root, manager, config) as ctx,
    ):
        with writing_to(out_dir):
            prepare_out_dir(out_dir, SNAPSHOT_OUTPUT, overwrite=overwrite)
            engine = await start_engine(engine_options, out_dir)
            try:
                spec = ScanSpec(replace(target, manager=manager), config, ())
                with _drawn(bar, "snapshot"):
                    cluster = await run_snapshot(
                        ctx,
                        engine,
                        spec,
                        partitions=partitions or engine.default_partitions(),
                        out=out_dir,
                    )
            finally:
                await engine.close()
    out.write(
        f"snapshot of {cluster.ledgers} ledgers and {len(cluster.locations)} bookie locations "
        f"written to {out_dir}\n"
    )
    return 0


async def cmd_scan_snapshot(
    snapshot: Path,
    config: AuditorConfig,
    args: ScanArgs,
    out: TextIO = sys.stdout,
    bar: ProgressBar | None = None,
) -> int:
    if args.mark:
        raise ConfigError("--mark needs the live cluster; a snapshot scan writes no marks")
    checks = snapshot_checks(args.checks)
    cluster = SnapshotCluster.load(snapshot)
    check_out_dir(args.out, SCAN_OUTPUT, overwrite=args.overwrite)
    require(args.engine, parquet=True)
    with writing_to(args.out):
        prepare_out_dir(args.out, SCAN_OUTPUT, overwrite=args.overwrite)
        engine = await start_engine(args.engine, args.out)
        try:
            job = SnapshotJudge(config, checks, cluster)
            with _drawn(bar, "scan of the snapshot"):
                result = await run_scan_from_snapshot(engine, job, snapshot, args.out)
        finally:
            await engine.close()
    _print(result, args.as_json, out)
    return 1 if result.has_findings else 0


def add_parsers(sub: Any) -> None:
    scan = sub.add_parser(
        "scan", help="bulk scrutiny in process or on Spark, to Parquet; exit 0 / 1 / 2"
    )
    cluster_args(scan)
    config_args(scan)
    engine_args(scan)
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
    progress_args(scan)
    bind(scan, scan_command, findings=True)
    snap = sub.add_parser("snapshot", help="write all ledger metadata as Parquet")
    cluster_args(snap)
    config_args(snap)
    engine_args(snap)
    progress_args(snap)
    snap.add_argument("--out", required=True, metavar="DIR", help="output directory")
    snap.add_argument("--overwrite", action="store_true", help="replace a previous snapshot")
    bind(snap, snapshot_command, findings=True)


def _engine(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(args.engine, args.master, parse_spark_conf(args.spark_conf))


async def scan_command(args: argparse.Namespace) -> int:
    bar, config = progress_bar(args, load_config(args.config, args.overrides), scan=True)
    engine = _engine(args)
    scan_args = ScanArgs(
        checks=parse_checks(
            args.checks or (SNAPSHOT_DEFAULT_CHECKS if args.from_snapshot else DEFAULT_CHECKS)
        ),
        engine=engine,
        partitions=args.partitions,
        out=Path(args.out),
        mark=args.mark,
        overwrite=args.overwrite,
        as_json=args.json,
    )
    if args.from_snapshot:
        return await cmd_scan_snapshot(Path(args.from_snapshot), config, scan_args, bar=bar)
    return await cmd_scan(target_of_args(args, config), config, scan_args, bar=bar)


async def snapshot_command(args: argparse.Namespace) -> int:
    bar, config = progress_bar(args, load_config(args.config, args.overrides), scan=True)
    engine = _engine(args)
    return await cmd_snapshot(
        target_of_args(args, config),
        config,
        engine,
        args.partitions,
        Path(args.out),
        args.overwrite,
        bar=bar,
    )
