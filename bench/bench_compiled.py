"""What compiling a module with mypyc buys can only be seen on the code it compiles: the CLI's
CPU a ledger moves by a few per cent beside the socket writes, ZooKeeper's replies and the
interpreter's start, and this machine's load moves it by more. So this times, in one
process, the per-ledger pure computation of `check replicas` that the compiled modules do,
each piece alone, on the bench cluster's ledgers (E3/W2/A2, 10 entries, clean):

- `decode`: a ledger znode's bytes to `LedgerMetadata` (metadata/serde.py, model.py);
- `judge`: skip_reason, the listing duties and the verdict straight from the three
  bookies' availability bytes (checks/replicas.py, bookie/availability.py);
- `request`: the three GET_LIST_OF_ENTRIES_OF_LEDGER frames (bookie/protocol.py);
- `answer`: three answer frames split, parsed and their status read (bookie/protocol.py);
- `path`: a ledger znode's id from its path (metadata/paths.py).

`python -m bench.bench_compiled [N]` prints one JSON line: each piece's best CPU µs a
ledger over `BENCH_COMPILED_REPEAT` passes (default 5), and which of the modules were
imported compiled. `python -m bench.compiled` builds the compiled modules in place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from auditor.bookie import protocol
from auditor.bookie.availability import Availability
from auditor.checks import replicas
from auditor.metadata import paths, serde
from auditor.metadata.layout import LedgerManager
from auditor.metadata.model import LedgerMetadata
from auditor.proto import bookkeeper_protocol_pb2 as pb
from auditor.testing.cluster import make_metadata
from bench.cluster import held_runs
from bench.common import ENTRIES, ROOT, A, E, W

REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 600.0
BOOKIES = [f"127.0.0.1:{3181 + i}" for i in range(6)]
#: The modules whose compiled form this reads (the rest of the path is not timed here).
TIMED_MODULES = (
    "auditor.bookie.availability",
    "auditor.bookie.protocol",
    "auditor.checks.replicas",
    "auditor.metadata.model",
    "auditor.metadata.paths",
    "auditor.metadata.schedule",
    "auditor.metadata.serde",
)


def _ledgers(n: int) -> list[LedgerMetadata]:
    template = make_metadata(
        0, BOOKIES[:E], write_quorum=W, ack_quorum=A, last_entry_id=ENTRIES - 1, length=16
    )
    segment = template.segments[0]
    out = []
    for ledger_id in range(1, n + 1):
        ensemble = tuple(BOOKIES[(ledger_id + k) % len(BOOKIES)] for k in range(E))
        out.append(
            replace(template, ledger_id=ledger_id, segments=(replace(segment, bookies=ensemble),))
        )
    return out


def _answer_frame(txn_id: int, ledger_id: int, data: bytes) -> bytes:
    op = protocol.Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
    resp = pb.Response(
        header=protocol.response_header(op, txn_id),
        status=pb.EOK,
        getListOfEntriesOfLedgerResponse=pb.GetListOfEntriesOfLedgerResponse(
            status=pb.EOK, ledgerId=ledger_id, availabilityOfEntriesOfLedger=data
        ),
    )
    return protocol.encode_message(resp)


def _best(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def compiled_status() -> dict[str, bool]:
    """Which of the timed modules were imported from a compiled extension."""
    return {name: not sys.modules[name].__file__.endswith(".py") for name in TIMED_MODULES}  # type: ignore[union-attr]


def measure(n: int, repeat: int) -> dict[str, object]:
    ledgers = _ledgers(n)
    blobs = [serde.encode_ledger_metadata(md) for md in ledgers]
    znodes = [paths.ledger_path(LedgerManager.HIERARCHICAL, ROOT, md.ledger_id) for md in ledgers]
    shares = [
        Availability.from_runs((s, t - s) for s, t in held_runs(i)).encode() for i in range(E)
    ]
    listings = [{b: shares[i] for i, b in enumerate(md.segments[0].bookies)} for md in ledgers]
    answers = [
        b"".join(_answer_frame(3 * k + i, md.ledger_id, shares[i]) for i in range(E))
        for k, md in enumerate(ledgers)
    ]

    def decode() -> None:
        for md, blob in zip(ledgers, blobs, strict=True):
            serde.decode_ledger_metadata(blob, md.ledger_id)

    def judge() -> None:
        for md, listed in zip(ledgers, listings, strict=True):
            if replicas.skip_reason(md) is None:
                duties = replicas.listing_duties(md)
                if not replicas.listed_in_full(md, duties, listed):
                    raise AssertionError(f"ledger {md.ledger_id} not judged in full")

    def request() -> None:
        frame = protocol.list_request_frame
        for k, md in enumerate(ledgers):
            for i in range(E):
                frame(3 * k + i, md.ledger_id)

    def answer() -> None:
        parser = protocol.FrameParser()
        ok = protocol.Status.EOK
        for frames in answers:
            for payload in parser.feed(frames):
                resp = protocol.decode_response(payload)
                if protocol.effective_status(resp) is not ok:
                    raise AssertionError("answer not EOK")

    def path() -> None:
        for znode in znodes:
            paths.ledger_id_from_path(ROOT, znode)

    pieces = {"decode": decode, "judge": judge, "request": request, "answer": answer}
    pieces["path"] = path
    us = {name: round(_best(run, repeat) / n * 1e6, 2) for name, run in pieces.items()}
    return {
        "bench": "compiled-pieces",
        "n": n,
        "repeat": repeat,
        "load_avg_before": float(open("/proc/loadavg").read().split()[0]),
        "cpu_us_per_ledger": us,
        "total_us_per_ledger": round(sum(us.values()), 2),
        "compiled": compiled_status(),
    }


def run_child(n: int) -> dict[str, Any]:
    """`measure` in a process of its own, started now: it imports whatever the source tree
    holds at this moment (the compiled modules of `BENCH_COMPILED=1`), not what the
    calling process imported before they were built."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_compiled", str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=CHILD_TIMEOUT,
        cwd=REPO,
    )
    figure: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figure


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    repeat = int(os.environ.get("BENCH_COMPILED_REPEAT", "5"))
    print(json.dumps(measure(n, repeat)), flush=True)


if __name__ == "__main__":
    main()
