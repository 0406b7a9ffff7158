"""The daemon's HTML page, rendered on the server from `DaemonState` (no JavaScript).

One page: who leads, each check's last run and its age, the violations of each
check's last report by category with sample ledgers and their owners (Pulsar
topics when known), the risk summary, the Pulsar audit's rows per namespace (the
same bounded rows as the `pulsar_*` metrics) and the replication worker's progress.
Every value read from the state (and so, ultimately, from ZooKeeper and the
bookies) goes through `html.escape`.
"""

from __future__ import annotations

import html
import time
from urllib.parse import quote

from auditor.api.convert import scrub_json, scrub_status, scrub_text
from auditor.checks.findings import Check
from auditor.daemon.state import CheckState, DaemonState
from auditor.timefmt import iso
from auditor.worker.risk import BUCKETS, QueueRisk

#: Sample ledgers shown per category (the report keeps a few more).
SAMPLES_SHOWN = 5
#: Risk rows shown (the largest counts first).
RISK_ROWS = 20

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.ok { color: #17692b; } .bad { color: #a8160c; font-weight: bold; } .muted { color: #777; }
code { font-size: .95em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _age(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d"


def _when(ts: float | None) -> str:
    return _e(iso(ts)) if ts is not None else '<span class="muted">never</span>'


def _table(head: list[str] | None, rows: list[list[str]]) -> str:
    """`rows` hold HTML already escaped; no `head`: a table of names (first column) and
    values."""
    thead = "" if head is None else "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head)
    if head is None:
        body = "".join(
            f"<tr><th>{_e(r[0])}</th>" + "".join(f"<td>{c}</td>" for c in r[1:]) + "</tr>"
            for r in rows
        )
    else:
        thead += "</tr></thead>"
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def _leader(state: DaemonState) -> str:
    leader = state.leader or "none elected"
    me = " (this node)" if state.is_leader else ""
    rows = [
        ["Leader", f'<strong id="leader">{_e(leader)}</strong>{_e(me)}'],
        ["This node", _e(state.identity)],
        ["Election", f"{_e(state.election)}, phase {_e(state.phase)}"],
        [
            "Metadata store",
            "connected" if state.zk_connected else '<span class="bad">disconnected</span>',
        ],
        [
            "Auto-recovery",
            "enabled" if state.replication_enabled else '<span class="bad">disabled</span>',
        ],
        ["Lost bookies", _e(", ".join(state.lost_bookies) or "none")],
        ["Started", _when(state.started_at)],
    ]
    return "<h2>Auditor</h2>" + _table(None, rows)


def _check_row(cs: CheckState, now: float) -> list[str]:
    report = cs.last_report
    outcome = str(cs.outcome)
    cls = "bad" if outcome in ("violations", "failed") else ("ok" if outcome == "ok" else "")
    violations = "" if report is None else _e(report.violations.total)
    name = _e(cs.check)
    if report is not None:
        name = f'<a href="/reports/{quote(str(cs.check))}">{name}</a>'
    error = f'<br><span class="bad">{_e(cs.last_error)}</span>' if cs.last_error else ""
    return [
        name,
        f'<span class="{cls}">{_e(outcome)}</span>{error}',
        _when(cs.last_finished),
        _e(_age(cs.last_success_age(now))),
        _when(cs.next_run) if cs.enabled else '<span class="muted">off</span>',
        "" if report is None else _e(report.ledgers_checked),
        violations,
    ]


def _checks(state: DaemonState, now: float) -> str:
    rows = [_check_row(state.checks[c], now) for c in Check if c in state.checks]
    head = ["Check", "Outcome", "Last run", "Age", "Next run", "Ledgers", "Violations"]
    note = ""
    if not state.is_leader:
        note = (
            '<p class="muted">Only the auditor runs checks; it is '
            f"{_e(state.leader or 'not elected yet')}.</p>"
        )
    return "<h2>Checks</h2>" + note + _table(head, rows)


def _violations(state: DaemonState) -> str:
    rows: list[list[str]] = []
    for c in Check:
        cs = state.checks.get(c)
        report = cs.last_report if cs is not None else None
        if report is None:
            continue
        for category, n in report.counts().items():
            if not n:
                continue
            samples = report.violations.samples(category)[:SAMPLES_SHOWN]
            ledgers = []
            for lid in samples:
                owner = report.owners.get(lid)
                who = f' <span class="muted">({_e(owner.key)})</span>' if owner is not None else ""
                ledgers.append(f'<a href="/explain/{lid}">{lid}</a>{who}')
            rows.append([_e(c), _e(category), _e(n), "<br>".join(ledgers)])
    if not rows:
        return '<h2>Violations</h2><p class="ok">None in the last reports.</p>'
    head = ["Check", "Category", "Ledgers", "Sample ledgers (owner)"]
    return "<h2>Violations</h2>" + _table(head, rows)


def _risk(state: DaemonState) -> str:
    t = state.tallies
    if not t.risk_last_run:
        return '<h2>Risk</h2><p class="muted">No risk report on this node.</p>'
    nonzero = [(k, n) for k, n in t.at_risk.items() if n]
    at_risk = sorted(nonzero, key=lambda kv: (-kv[1], kv[0]))[:RISK_ROWS]
    when = f"<p>Last report {_when(t.risk_last_run)}.</p>"
    if not at_risk:
        return f'<h2>Risk</h2>{when}<p class="ok">No ledger at risk from one failure domain.</p>'
    rows = [[_e(d), _e(name), _e(sev), _e(int(n))] for (d, name, sev), n in at_risk]
    return (
        f"<h2>Risk</h2>{when}"
        "<p>Ledgers that losing one failure domain would leave below their ack quorum "
        "or without a copy:</p>" + _table(["Domain", "Name", "Severity", "Ledgers"], rows)
    )


#: The Pulsar rows' columns: (state label, heading, with bytes).
_PULSAR_COLUMNS = (
    ("referenced", "Ledgers", True),
    ("missing", "Missing", True),
    ("dangling_cursor", "Dangling cursors", False),
    ("orphan", "Orphans", True),
    ("underreplicated", "Under-replicated", True),
    ("unplaced", "Unplaced", True),
)


def _pulsar(state: DaemonState) -> str:
    """The last Pulsar audit per namespace: the metrics' rows (top N, then "other")."""
    t = state.tallies
    if Check.PULSAR not in state.checks and not t.pulsar_last_run:
        return ""
    if not t.pulsar_last_run:
        return '<h2>Pulsar</h2><p class="muted">No Pulsar audit on this node yet.</p>'
    namespaces = list(dict.fromkeys(ns for ns, _ in t.pulsar_ledgers))
    rows: list[list[str]] = []
    for ns in namespaces:
        row = [_e(ns)]
        for st, _, sized in _PULSAR_COLUMNS:
            n = t.pulsar_ledgers.get((ns, st), 0)
            cell = _e(n)
            if sized and n:
                cell += f' <span class="muted">({_e(t.pulsar_bytes.get((ns, st), 0))} B)</span>'
            if n and st in ("missing", "dangling_cursor"):
                cell = f'<span class="bad">{cell}</span>'
            row.append(cell)
        rows.append(row)
    head = ["Namespace", *(h for _, h, _ in _PULSAR_COLUMNS)]
    link = '<a href="/reports/pulsar">/reports/pulsar</a>'
    return (
        f"<h2>Pulsar</h2><p>Last audit {_when(t.pulsar_last_run)}; findings and the "
        f"per-topic rollup: {link}.</p>" + _table(head, rows)
    )


def _worker(state: DaemonState, now: float) -> str:
    w = state.worker
    if not w.enabled:
        return '<h2>Replication worker</h2><p class="muted">Off on this node.</p>'
    status = "running" if w.running else "stopped"
    if w.waiting:
        status += f", waiting: {w.waiting}"
    failures = ", ".join(f"{f}: {n}" for f, n in sorted(w.failures.items()) if n) or "none"
    rows = [
        ["Status", _e(status)],
        ["Ledgers replicated", _e(w.ledgers_replicated)],
        ["Found healthy", _e(w.ledgers_found_healthy)],
        ["Fragments replicated", _e(w.fragments_replicated)],
        ["Entries read / written", f"{_e(w.entries_read)} / {_e(w.entries_written)}"],
        ["Bytes read / written", f"{_e(w.bytes_read)} / {_e(w.bytes_written)}"],
        ["Failures", _e(failures)],
        ["Unrecoverable ledgers", _e(", ".join(str(i) for i in sorted(w.unrecoverable)) or "none")],
    ]
    out = "<h2>Replication worker</h2>" + _table(None, rows)
    if w.in_hand:
        held = [
            [
                _e(lid),
                _e(h.step),
                _e(_age(now - h.since)),
                "<br>".join(_e(f) for f in h.fragments),
            ]
            for lid, h in sorted(w.in_hand.items())
        ]
        out += _table(["Ledger in hand", "Step", "For", "Fragments"], held)
    if w.queue is not None:
        out += _queue(w.queue, now)
    return out


def _queue(q: QueueRisk, now: float) -> str:
    """The marked ledgers by copies left, how long the oldest of each has waited, and the
    next ones in take order: what the worker copies first, and what is one failure away
    from loss."""
    rows = []
    for bucket in BUCKETS:
        n = q.by_copies.get(bucket, 0)
        since = q.oldest.get(bucket)
        waited = _e(_age(now - since)) if since is not None else '<span class="muted">-</span>'
        cell = _e(n)
        if n and bucket in ("0", "1"):
            cell, waited = f'<span class="bad">{cell}</span>', f'<span class="bad">{waited}</span>'
        rows.append([_e(bucket), cell, waited])
    out = f"<h3>Marked ledgers by copies left</h3><p>Ranked {_when(q.ranked_at)}.</p>"
    out += _table(["Copies left", "Ledgers", "Oldest waiting for"], rows)
    if q.head:
        nxt = []
        for item in q.head:
            r = item.risk
            nxt.append(
                [
                    _e(item.ledger_id),
                    _e("?" if r.copies_left is None else r.copies_left),
                    _e("?" if r.racks_left is None else r.racks_left),
                    _e(_age(now - r.marked_at)),
                    _e("yes" if item.in_flight else "no"),
                ]
            )
        out += _table(
            ["Next in take order", "Copies left", "Racks", "Waiting for", "In flight"], nxt
        )
    return out


def _scrub(state: DaemonState) -> str:
    """The continuous deep scrub's cycle (`status`'s line), and its last chunk's findings
    among the checks' violations above."""
    if Check.SCRUB not in state.checks:
        return ""
    if state.scrub is None:
        return '<h2>Deep scrub</h2><p class="muted">Not on this node (the leader scrubs).</p>'
    doc = scrub_json(scrub_status(state.scrub))
    share = f"{doc['share']:.1%}"
    return (
        f"<h2>Deep scrub</h2><p>{_e(scrub_text(doc))}</p>"
        f'<p><progress max="1" value="{_e(doc["share"])}">{_e(share)}</progress></p>'
    )


def render_page(state: DaemonState, now: float | None = None) -> str:
    """The whole page, as text."""
    now = time.time() if now is None else now
    title = f"bk-auditor {state.identity}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="refresh" content="30">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="muted">As of {_e(iso(now))}. JSON: <a href="/status">/status</a>, '
        "<code>/reports/&lt;check&gt;</code>, <code>/explain/&lt;ledger id&gt;</code>.</p>"
        + _leader(state)
        + _checks(state, now)
        + _violations(state)
        + _risk(state)
        + _pulsar(state)
        + _worker(state, now)
        + _scrub(state)
        + "</body></html>\n"
    )
