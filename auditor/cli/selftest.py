"""`bk-auditor selftest`: the detector self-test, here and now, without a cluster.

The same fixtures the leader runs periodically; useful after an upgrade or
a local change to an analysis core. Exit 0 when every detector found every
known defect exactly, 1 when one did not.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from auditor.cli.options import bind
from auditor.selftest.cases import run_selftest


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "selftest",
        help="feed every check's analysis core known defects; exit 0 all found, 1 not",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    bind(p, selftest_command)


async def selftest_command(args: argparse.Namespace) -> int:
    return cmd_selftest(args)


def cmd_selftest(args: argparse.Namespace) -> int:
    results = run_selftest()
    ok = all(r.ok for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [r.to_json() for r in results]}, sort_keys=True))
    else:
        for r in results:
            print(r.summary())
    return 0 if ok else 1
