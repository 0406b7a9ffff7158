"""A scan's results are read after it ends, by people and by other tools, whichever engine
wrote them, so the layout and the columns are fixed in one place; and DIR is the operator's
input, whose faults must come as one line, before the scan connects wherever they can.

A scan's output directory: the datasets' columns, the rows, and the summary.

Layout of DIR (the same from every engine):
- `violations/`: Parquet, one row per violation (ledger, check, category,
  bookie, evidence as JSON, metadata version);
- `coverage/`: Parquet, one row per (ledger, check): how it came out
  (ok / violation / skipped and why) and, for the replicas check, how many
  ensemble bookies were listed, probed or left unverified;
- `summary.json`: exactly the document `check all --json` prints, for the
  checks the scan ran;
- `marks.json`: the under-replication marks the checks asked for, and
  whether they were written (`--mark`);
- `_partial/`: the datasets while they are written (`PARTIAL`), moved into place
  just before `summary.json`; only an interrupted scan leaves it behind.

The columns are declared once here and turned into a pyarrow schema (the
in-process engine) or a Spark schema (the Spark engine), so the two engines
cannot drift apart. Both are imported on demand: the scan's extras are optional.

DIR is the operator's input: one that cannot be written (under a file,
read-only, on a full disk) is an `OutputError`, one line and exit 2, never an
internal error. What can be checked without writing is checked before the
scan connects to anything (`check_out_dir`); DIR is then made and proved
writable before the first ledger is read (`prepare_out_dir`); a disk that
fills up during the scan is caught where the command runs it (`writing_to`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from auditor.checks.findings import CheckReport, LedgerOutcome, PendingMark, Violation
from auditor.checks.pulsar_audit import PulsarAudit
from auditor.errors import AuditorError, ConfigError

VIOLATIONS = "violations"
COVERAGE = "coverage"
SUMMARY = "summary.json"
MARKS = "marks.json"
SCAN_OUTPUT = (VIOLATIONS, COVERAGE, SUMMARY, MARKS)
#: Where a scan's datasets are written while it runs (`DIR/_partial/coverage`, ...). Parquet
#: readers (Spark, Hadoop, pyarrow, DuckDB's globs of DIR/coverage/) never see it: a name
#: starting with '_' is skipped, and it is not under the datasets' own directories. The
#: scan's last write moves them into place (`publish_datasets`), just before summary.json;
#: an interrupted scan leaves only this, which the next scan into DIR removes.
PARTIAL = "_partial"

#: (name, type, nullable); types are "long", "int", "string", "bool", and two nested ones
#: of the snapshot: "kv_list" (list of key string / value binary) and "segment_list"
#: (list of first_entry_id long / bookies list of string).
Column = tuple[str, str, bool]

VIOLATION_COLUMNS: tuple[Column, ...] = (
    ("ledger_id", "long", False),
    ("check", "string", False),
    ("category", "string", False),
    ("bookie", "string", True),
    ("evidence", "string", False),
    ("metadata_version", "long", True),
)

COVERAGE_COLUMNS: tuple[Column, ...] = (
    ("ledger_id", "long", False),
    ("check", "string", False),
    ("outcome", "string", False),
    ("skip_reason", "string", True),
    ("metadata_version", "long", False),
    ("bookies_listed", "int", False),
    ("bookies_probed", "int", False),
    ("bookies_unverified", "int", False),
)

ViolationRow = tuple[int, str, str, str | None, str, int | None]
CoverageRow = tuple[int, str, str, str | None, int, int, int, int]


def violation_row(check: str, v: Violation) -> ViolationRow:
    version = v.detail.get("metadata_version")
    return (
        v.ledger_id,
        check,
        str(v.category),
        v.bookie,
        json.dumps(v.detail, sort_keys=True),
        int(version) if isinstance(version, int) else None,
    )


def violation_rows(reports: Iterable[CheckReport]) -> list[ViolationRow]:
    rows = [violation_row(str(r.check), v) for r in reports for v in r.violations]
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3] or ""))


def coverage_row(o: LedgerOutcome) -> CoverageRow:
    return (
        o.ledger_id,
        str(o.check),
        str(o.outcome),
        o.skip_reason,
        o.metadata_version,
        o.listed,
        o.probed,
        o.unverified,
    )


def arrow_schema(columns: Sequence[Column]) -> Any:
    import pyarrow as pa

    types = {
        "long": pa.int64(),
        "int": pa.int32(),
        "string": pa.string(),
        "bool": pa.bool_(),
        "kv_list": pa.list_(
            pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary(), False)])
        ),
        "segment_list": pa.list_(
            pa.struct(
                [
                    pa.field("first_entry_id", pa.int64(), False),
                    pa.field("bookies", pa.list_(pa.string()), False),
                ]
            )
        ),
    }
    return pa.schema([pa.field(n, types[t], nullable=null) for n, t, null in columns])


def spark_schema(columns: Sequence[Column]) -> Any:
    from pyspark.sql import types as st

    kinds = {
        "long": st.LongType(),
        "int": st.IntegerType(),
        "string": st.StringType(),
        "bool": st.BooleanType(),
        "kv_list": st.ArrayType(
            st.StructType(
                [
                    st.StructField("key", st.StringType(), False),
                    st.StructField("value", st.BinaryType(), False),
                ]
            )
        ),
        "segment_list": st.ArrayType(
            st.StructType(
                [
                    st.StructField("first_entry_id", st.LongType(), False),
                    st.StructField("bookies", st.ArrayType(st.StringType()), False),
                ]
            )
        ),
    }
    return st.StructType([st.StructField(n, kinds[t], null) for n, t, null in columns])


def arrow_table(columns: Sequence[Column], rows: Sequence[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    names = [c[0] for c in columns]
    data = {name: [r[i] for r in rows] for i, name in enumerate(names)}
    return pa.Table.from_pydict(data, schema=arrow_schema(columns))


class OutputError(AuditorError):
    """The output directory cannot be made or written: under a file, read-only, full."""

    exit_code = 2


#: The disk is full: whatever file the error names, it is the scan's output (nothing else
#: is written), and the error may name none.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: A file system refusing a path: the output's when the error names a path inside DIR.
_REFUSED = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENOENT,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EIO,
    }
)


def _inside(name: Any, out: Path) -> bool:
    if not isinstance(name, str | bytes | os.PathLike):
        return False
    path = os.path.abspath(os.fsdecode(name))
    top = os.path.abspath(out)
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def output_error(out: Path, exc: OSError) -> OutputError | None:
    """`exc` as the one-line error of an unwritable `--out DIR`; None when it is not that."""
    named = [n for n in (exc.filename, exc.filename2) if n is not None]
    if exc.errno not in _FULL:
        if exc.errno not in _REFUSED:
            return None
        if named and not any(_inside(n, out) for n in named):
            return None
        # pyarrow names the file in its message only.
        top = os.path.abspath(out)
        if not named and top + os.sep not in str(exc) and f"'{top}'" not in str(exc):
            return None
    where = f" ({os.fsdecode(named[0])})" if named else ""
    return OutputError(f"--out {out} cannot be written: {exc.strerror or exc}{where}")


@contextlib.contextmanager
def writing_to(out: Path) -> Iterator[None]:
    """Turns a file-system error of writing DIR (refused, full) into an `OutputError`."""
    try:
        yield
    except OSError as exc:
        mapped = output_error(out, exc)
        if mapped is None:
            raise
        raise mapped from exc


def _nearest_existing(out: Path) -> Path:
    path = Path(os.path.abspath(out))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(out: Path, names: Sequence[str], *, overwrite: bool) -> list[str]:
    """Refuses to mix new output into an old one, unless told to replace it (nothing written).

    DIR, or the nearest of its parents that exists, must be a directory.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    existing = _nearest_existing(out)
    if not existing.is_dir():
        raise OutputError(f"--out {out} cannot be made: {existing} is not a directory")
    old = [p for p in names if (out / p).exists()]
    if old and not overwrite:
        raise ConfigError(
            f"--out {out} already holds output ({', '.join(old)}); "
            "choose another directory or pass --overwrite"
        )
    return old


def prepare_out_dir(out: Path, names: Sequence[str], *, overwrite: bool) -> None:
    """Makes DIR, proves it writable (a file created and removed), and clears old output.

    The datasets an interrupted scan left in `DIR/_partial/` are removed whatever
    `overwrite` says: they were never output (nothing read them as such), and appending
    to them would mix two scans' rows."""
    old = check_out_dir(out, names, overwrite=overwrite)
    with writing_to(out):
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".bk-auditor-probe-"):
            pass
        if (out / PARTIAL).is_dir():
            shutil.rmtree(out / PARTIAL)
        for name in old:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()


def partial(out: Path, dataset: str) -> Path:
    """Where `dataset` of a scan into `out` is written until `publish_datasets`."""
    return out / PARTIAL / dataset


def publish_datasets(out: Path, names: Sequence[str] = (COVERAGE, VIOLATIONS)) -> None:
    """Moves the scan's finished datasets from `DIR/_partial/` to `DIR/` (a rename each, on
    one file system) and removes `_partial/`. Called once every row is written, before
    summary.json: a reader then never finds a dataset that is still growing, nor one that
    an interrupted scan left half-written."""
    for name in names:
        source = partial(out, name)
        if source.exists():
            source.replace(out / name)
    shutil.rmtree(out / PARTIAL, ignore_errors=True)


def summary_document(
    reports: Sequence[CheckReport], pulsar: PulsarAudit | None = None
) -> dict[str, Any]:
    """The `check all --json` document of these reports; with the Pulsar audit, its
    rollups under `pulsar` (`pulsar-audit --json`'s)."""
    doc: dict[str, Any] = {"check": "all", "reports": {str(r.check): r.to_json() for r in reports}}
    if pulsar is not None:
        doc["pulsar"] = pulsar.to_json()
    return doc


def marks_document(marks: Sequence[PendingMark], written: set[int]) -> list[dict[str, Any]]:
    return [
        {
            "check": str(m.check),
            "ledger_id": m.ledger_id,
            "missing_replicas": list(m.missing),
            "marked": m.ledger_id in written,
        }
        for m in sorted(marks, key=lambda m: (m.ledger_id, str(m.check)))
    ]


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
