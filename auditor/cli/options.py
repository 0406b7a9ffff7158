"""What every command module registers with: the flag groups commands share, and `bind`.

A command is a module of `cli/` with an `add_parsers(sub)` that adds its subparsers, gives
them their flags (the shared groups here, then its own) and binds each to the coroutine
that runs it with `bind`; `cli/main.py` lists the modules in the order `--help` shows
their commands and runs whatever the parsed arguments are bound to. So a command's name,
flags and code live in one module, and there is no list of names to keep in step.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from auditor.cli.argtypes import MAX_TIMEOUT, seconds
from auditor.cli.cluster import ZK_ENV
from auditor.scan.options import ENGINES

#: What runs a command: the parsed arguments in, the exit code out.
Command = Callable[[argparse.Namespace], Awaitable[int]]


def bind(p: argparse.ArgumentParser, command: Command, *, findings: bool = False) -> None:
    """Binds a subcommand to what runs it: the one way a command is registered.

    `findings`: the command's exit 1 is something it found (`check`'s violations, a
    ledger `explain` flags, a risk), so `main` makes any failure to run it exit 2, after
    setting up the structured log lines its checks write.
    """
    p.set_defaults(command_run=command, command_findings=findings)


def cluster_args(p: argparse.ArgumentParser) -> None:
    """Where the cluster is and how to reach its metadata store; `--json`."""
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


def config_args(p: argparse.ArgumentParser) -> None:
    """The checks' settings: a TOML file and single keys."""
    p.add_argument("--config", metavar="FILE", help="TOML config ([bookkeeper], [checks])")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key (a BookKeeper key, or checks.KEY)",
    )


def engine_args(p: argparse.ArgumentParser) -> None:
    """Where bulk work runs: in process, or on Spark."""
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


def progress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on a terminal (the periodic progress log line instead)",
    )


def emit(out: TextIO, as_json: bool, doc: dict[str, Any], text: str) -> None:
    """One result line: `doc` as JSON with `--json`, else `text`."""
    out.write((json.dumps(doc) if as_json else text) + "\n")
